//! What the ONNX checker (and onnxruntime on load) refuses in what this importer reads, refused here too
//! rather than run: a model without an opset for the default domain or with one ONNX has not released,
//! and a value name defined twice (the later definition would silently win).

use super::importer::{Cur, format_err};
use super::pb;
use crate::error::Result;
use std::collections::HashSet;

/// The newest opset of the default domain that ONNX has released (onnx 1.23's, the newest that
/// onnxruntime 1.32 loads): a model stamped past it is for operators whose meaning is not known yet.
pub(super) const MAX_OPSET: i64 = 28;

/// The model's opset for the default domain (`""` or `ai.onnx`), which every ONNX model must import.
pub(super) fn default_opset(m: &pb::ModelProto, model: &str) -> Result<i64> {
    let mut found = m
        .opset_import
        .iter()
        .filter(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")));
    let Some(o) = found.next() else {
        return Err(format_err(
            model,
            "the model imports no opset for the default ONNX domain (opset_import names none; every ONNX model must)",
        ));
    };
    if found.next().is_some() {
        return Err(format_err(
            model,
            "the model imports the default ONNX domain twice (opset_import)",
        ));
    }
    match o.version {
        Some(v @ 1..=MAX_OPSET) => Ok(v),
        Some(v) => Err(format_err(
            model,
            format!(
                "opset {v} of the default ONNX domain is not one ONNX has released (1 to {MAX_OPSET})"
            ),
        )),
        None => Err(format_err(
            model,
            "the default ONNX domain's opset_import has no version",
        )),
    }
}

/// The value names defined so far (initializers, the graph's inputs, node outputs): each is defined once.
pub(super) struct Defined(HashSet<String>);

impl Defined {
    /// The initializers and graph inputs of `g` (an input may repeat an initializer's name: older
    /// exporters list weights as inputs too).
    pub(super) fn of(g: &pb::GraphProto, model: &str) -> Result<Defined> {
        let mut names = HashSet::new();
        for t in &g.initializer {
            let name = t.name.clone().unwrap_or_default();
            if !names.insert(name.clone()) {
                return Err(format_err(
                    model,
                    format!("initializer `{name}` is defined twice"),
                ));
            }
        }
        let inits = names.clone();
        let mut inputs = HashSet::new();
        for i in &g.input {
            let name = i.name.clone().unwrap_or_default();
            if !inputs.insert(name.clone()) {
                return Err(format_err(
                    model,
                    format!("graph input `{name}` is listed twice"),
                ));
            }
            if !inits.contains(&name) {
                names.insert(name);
            }
        }
        Ok(Defined(names))
    }

    /// Defines node `c`'s outputs (empty names are omitted optional outputs).
    pub(super) fn outputs(&mut self, c: &Cur, outputs: &[String]) -> Result<()> {
        for o in outputs.iter().filter(|o| !o.is_empty()) {
            if !self.0.insert(o.clone()) {
                return Err(c.err(format!(
                    "output `{o}` is already defined (by an initializer, the graph input or an earlier node): every value name must be defined once"
                )));
            }
        }
        Ok(())
    }
}
