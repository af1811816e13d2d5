//! Labels and per-item metadata from a CSV file.
//!
//! Format (see SPEC.md): a header row whose first two columns are `file,label`; an optional `boxes`
//! column (`x0 y0 x1 y1 [class]`, boxes separated by `;`); any other column becomes a key/value attribute
//! (empty cells are skipped). Without a header row every row must be exactly `file,label`. `file` matches
//! an input by its path as given, else by its name in the dataset (`a/x.jpg`), else by its file name.

use crate::error::{Error, Result};
use crate::item::BoundingBox;
use crate::writer::Input;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What the CSV says about one file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelRow {
    pub label: String,
    pub boxes: Vec<BoundingBox>,
    pub attrs: BTreeMap<String, String>,
}

/// A labels file, keyed by its `file` column.
#[derive(Debug, Clone)]
pub struct Labels {
    path: PathBuf,
    rows: HashMap<String, LabelRow>,
}

impl Labels {
    /// Reads a labels CSV file.
    pub fn from_csv(path: &Path) -> Result<Labels> {
        let text = stdx::fs::read_regular(path, 1 << 30).map_err(|e| Error::io(path, e))?;
        Self::parse(path, &text)
    }

    /// Parses labels CSV bytes; `path` only names the source in errors.
    pub fn parse(path: &Path, csv_bytes: &[u8]) -> Result<Labels> {
        let err = |reason: String| Error::Labels {
            path: path.to_path_buf(),
            reason,
        };
        let mut rd = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(csv_bytes);
        let mut columns: Vec<String> = vec!["file".into(), "label".into()];
        let mut rows = HashMap::new();
        let mut first = true;
        let mut line = 0;
        for rec in rd.records() {
            line += 1;
            let rec = rec.map_err(|e| err(format!("line {line}: {e}")))?;
            if first {
                first = false;
                let is_header = rec.len() >= 2
                    && rec[0].eq_ignore_ascii_case("file")
                    && rec[1].eq_ignore_ascii_case("label");
                if is_header {
                    columns = rec.iter().map(|c| c.to_ascii_lowercase()).collect();
                    continue;
                }
            }
            if rec.iter().all(str::is_empty) {
                continue;
            }
            if rec.len() != columns.len() {
                return Err(err(format!(
                    "line {line}: {} columns, the header has {}",
                    rec.len(),
                    columns.len()
                )));
            }
            let file = rec[0].to_string();
            if file.is_empty() {
                return Err(err(format!("line {line}: empty file name")));
            }
            let mut row = LabelRow {
                label: rec[1].to_string(),
                ..LabelRow::default()
            };
            for (name, value) in columns.iter().zip(rec.iter()).skip(2) {
                if name == "boxes" {
                    row.boxes = parse_boxes(value).map_err(|e| err(format!("line {line}: {e}")))?;
                } else if !value.is_empty() {
                    row.attrs.insert(name.clone(), value.to_string());
                }
            }
            if rows.insert(file.clone(), row).is_some() {
                return Err(err(format!("line {line}: {file} is listed twice")));
            }
        }
        Ok(Labels {
            path: path.to_path_buf(),
            rows,
        })
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The row for an input: by its path as given, else by its file name.
    pub fn get(&self, input: &Path) -> Option<&LabelRow> {
        input.to_str().and_then(|s| self.rows.get(s)).or_else(|| {
            let name = input.file_name()?.to_str()?;
            self.rows.get(name)
        })
    }

    /// The row for a writer input: by its path as given, else by its name in the dataset, else by its file
    /// name.
    pub fn get_input(&self, input: &Input) -> Option<&LabelRow> {
        input
            .path
            .to_str()
            .and_then(|s| self.rows.get(s))
            .or_else(|| self.rows.get(&input.name))
            .or_else(|| self.get(&input.path))
    }

    /// `inputs` with each one's label row applied; an input without a row is an error.
    pub fn apply(&self, inputs: Vec<Input>) -> Result<Vec<Input>> {
        inputs
            .into_iter()
            .map(|mut input| {
                let row = self.get_input(&input).ok_or_else(|| Error::Labels {
                    path: self.path.clone(),
                    reason: format!("no label for {}", input.path.display()),
                })?;
                input.label = Some(row.label.clone());
                input.boxes = row.boxes.clone();
                input.attrs = row.attrs.clone();
                Ok(input)
            })
            .collect()
    }

    /// Writer inputs for these paths ([`Input::new`]), each with its label row; an input without a row is
    /// an error.
    pub fn inputs(&self, paths: &[PathBuf]) -> Result<Vec<Input>> {
        self.apply(paths.iter().map(Input::new).collect())
    }
}

fn parse_boxes(cell: &str) -> std::result::Result<Vec<BoundingBox>, String> {
    cell.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|b| {
            let parts: Vec<&str> = b.split_whitespace().collect();
            if parts.len() != 4 && parts.len() != 5 {
                return Err(format!("box {b:?} is not `x0 y0 x1 y1 [class]`"));
            }
            let n = |s: &str| {
                s.parse::<f32>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| format!("box {b:?}: {s:?} is not a number"))
            };
            Ok(BoundingBox {
                x0: n(parts[0])?,
                y0: n(parts[1])?,
                x1: n(parts[2])?,
                y1: n(parts[3])?,
                label: parts.get(4).map(|s| s.to_string()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_boxes_attrs_and_lookup() {
        let csv = b"file,label,boxes,source\n\
                    a/Dune.jpg,desert,10 20 30 40 dune; 1 2 3 4,deb\n\
                    Wood.jpg,wood,,\n";
        let l = Labels::parse(Path::new("l.csv"), csv).unwrap();
        assert_eq!(l.len(), 2);
        let d = l.get(Path::new("a/Dune.jpg")).unwrap();
        assert_eq!(d.label, "desert");
        assert_eq!(d.boxes.len(), 2);
        assert_eq!(d.boxes[0].label.as_deref(), Some("dune"));
        assert_eq!(d.attrs.get("source").map(String::as_str), Some("deb"));
        // By file name, from another directory.
        assert_eq!(l.get(Path::new("/x/y/Wood.jpg")).unwrap().label, "wood");
        assert!(l.get(Path::new("Dune.jpg")).is_none());
        let err = l.inputs(&[PathBuf::from("Other.jpg")]).unwrap_err();
        assert!(err.to_string().contains("no label for Other.jpg"), "{err}");
    }

    #[test]
    fn headerless_and_errors() {
        let l = Labels::parse(Path::new("l.csv"), b"x.jpg,1\ny.jpg,2\n").unwrap();
        assert_eq!(l.get(Path::new("y.jpg")).unwrap().label, "2");
        for bad in [
            &b"x.jpg,1\nx.jpg,2\n"[..],
            b"x.jpg,1,extra\n",
            b"file,label,boxes\nx.jpg,1,1 2 3\n",
            b"file,label,boxes\nx.jpg,1,1 2 3 nan\n",
        ] {
            let e = Labels::parse(Path::new("l.csv"), bad).unwrap_err();
            assert!(e.to_string().starts_with("l.csv: "), "{e}");
        }
    }
}
