//! Element-wise ops: Identity and Dropout, the unary functions (PRelu and Clip with their constant
//! inputs), and the binary ops between images or with per-channel or scalar constants.

use super::importer::{Attrs, Cur, Importer, Ref, per_channel};
use crate::error::Result;
use crate::graph::ops::{BinOp, Op, Operand, Unary};

/// Identity or Dropout (inference): a constant stays a constant.
pub(super) fn identity(imp: &mut Importer, c: &Cur) -> Result<Ref> {
    if let Some(Ref::Const(k)) = c.input(0).and_then(|n| imp.names.get(n)) {
        return Ok(Ref::Const(k.clone()));
    }
    let (x, ch) = imp.value(c, 0)?;
    let (v, ch) = imp.push(c, Op::Identity, vec![x], ch);
    Ok(Ref::Value(v, ch))
}

/// The element-wise function of an op that takes no constant input, `None` for other ops.
pub(super) fn unary_of(op: &str, a: &Attrs) -> Option<Unary> {
    Some(match op {
        "Relu" => Unary::Relu,
        "LeakyRelu" => Unary::LeakyRelu(a.f("alpha", 0.01)),
        "Sigmoid" => Unary::Sigmoid,
        "Tanh" => Unary::Tanh,
        "Softplus" => Unary::Softplus,
        "Mish" => Unary::Mish,
        "HardSigmoid" => Unary::HardSigmoid(a.f("alpha", 0.2), a.f("beta", 0.5)),
        "HardSwish" => Unary::HardSwish,
        "Elu" => Unary::Elu(a.f("alpha", 1.0)),
        "Erf" => Unary::Erf,
        "Gelu" => Unary::Gelu {
            tanh: a.s("approximate", "none") == "tanh",
        },
        "Neg" => Unary::Neg,
        "Abs" => Unary::Abs,
        "Exp" => Unary::Exp,
        "Sqrt" => Unary::Sqrt,
        _ => return None,
    })
}

/// A node applying `u` to its one image input.
pub(super) fn unary(imp: &mut Importer, c: &Cur, u: Unary) -> Result<Ref> {
    let (x, ch) = imp.value(c, 0)?;
    let (v, ch) = imp.push(c, Op::Unary(u), vec![x], ch);
    Ok(Ref::Value(v, ch))
}

/// PRelu with its constant slope (scalar or per channel).
pub(super) fn prelu(imp: &mut Importer, c: &Cur) -> Result<Ref> {
    let (_, ch) = imp.value(c, 0)?;
    let s = imp.need_const(c, 1, "slope")?;
    let s = per_channel(c, &s, ch, "slope", false)?;
    unary(imp, c, Unary::PRelu(s))
}

/// Clip: bounds from attributes before opset 11, from scalar constant inputs since.
pub(super) fn clip(imp: &mut Importer, c: &Cur, a: &Attrs, opset: i64) -> Result<Ref> {
    let (lo, hi) = if opset < 11 {
        (a.f("min", f32::NEG_INFINITY), a.f("max", f32::INFINITY))
    } else {
        let get = |j, d: f32| -> Result<f32> {
            Ok(match imp.constant(c, j)? {
                Some(k) if k.f.len() == 1 => k.f[0],
                Some(_) => return Err(c.err("its min/max must be scalars")),
                None => d,
            })
        };
        (get(1, f32::NEG_INFINITY)?, get(2, f32::INFINITY)?)
    };
    unary(imp, c, Unary::Clip(lo, hi))
}

/// Add, Sub, Mul, Div, Max, Min or Pow.
pub(super) fn binary(imp: &mut Importer, c: &Cur) -> Result<Ref> {
    let op = c.op.as_str();
    let bop = match op {
        "Add" => BinOp::Add,
        "Sub" => BinOp::Sub,
        "Mul" => BinOp::Mul,
        "Div" => BinOp::Div,
        "Max" => BinOp::Max,
        "Min" => BinOp::Min,
        _ => BinOp::Pow,
    };
    if c.inputs.len() != 2 {
        return Err(c.err(format!("has {} inputs; two are supported", c.inputs.len())));
    }
    let mut ins = vec![];
    let mut chs = vec![];
    let mut operands = vec![];
    for j in 0..2 {
        let name = c
            .input(j)
            .ok_or_else(|| c.err(format!("input {j} is missing")))?;
        match imp.names.get(name) {
            Some(Ref::Value(v, ch)) => {
                operands.push(Operand::Input(ins.len()));
                ins.push(*v);
                chs.push(*ch);
            }
            Some(Ref::Const(_)) => operands.push(Operand::Const(vec![])),
            None => {
                return Err(c.err(format!("input `{name}` is not defined before this node")));
            }
        }
    }
    if ins.is_empty() {
        return Err(c.err("combines two constants (fold them before export)"));
    }
    let ch = *chs.iter().max().expect("one value");
    if chs.iter().any(|&x| x != ch && x != 1) {
        return Err(c.err(format!(
            "combines images of {} and {} channels",
            chs[0], chs[1]
        )));
    }
    for (j, o) in operands.iter_mut().enumerate() {
        if let Operand::Const(v) = o {
            let k = imp.need_const(c, j, "operand")?;
            *v = per_channel(c, &k, ch, "constant operand", false)?;
        }
    }
    let mut it = operands.into_iter();
    let (lhs, rhs) = (it.next().expect("two"), it.next().expect("two"));
    let (v, ch) = imp.push(c, Op::Binary { op: bop, lhs, rhs }, ins, ch);
    Ok(Ref::Value(v, ch))
}
