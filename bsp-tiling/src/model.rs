//! The network as a list of stages, and Johnson et al.'s TransformerNet loaded from safetensors.
//!
//! A *stage* is one convolution and what directly follows it: optional nearest ×2 upsampling before it,
//! padding, the convolution, an optional normalisation (+ReLU), an optional residual add. Stages are the
//! BSP supersteps: the only points where a tile needs its neighbours (the halo of the convolution) or the
//! whole image (the statistics of the normalisation).

use crate::backend::{Conv2d, Norm};
use crate::error::{Error, Result};
use crate::padding::PaddingMode;
use crate::stats::ChannelStats;
use std::collections::HashMap;
use std::path::Path;

/// One convolution with its padding, normalisation, activation and residual connection.
#[derive(Clone, Debug)]
pub struct Stage {
    /// PyTorch module name of the convolution (`conv1`, `res3.conv2`, `deconv1`, ...).
    pub name: String,
    /// Nearest ×2 upsampling before the padding (`UpsampleConvLayer`).
    pub upsample: bool,
    /// Padding on every side (`kernel_size // 2` in the TransformerNet), applied with the net's mode.
    pub pad: usize,
    pub conv: Conv2d,
    /// Normalisation with the statistics of this conv's output over the whole image.
    pub norm: Option<Norm>,
    pub relu: bool,
    /// Adds the output of that earlier stage after the normalisation.
    pub residual: Option<usize>,
}

/// A feed-forward CNN of [`Stage`]s with one padding mode.
#[derive(Clone, Debug)]
pub struct Net {
    pub stages: Vec<Stage>,
    pub padding: PaddingMode,
    /// Input channels.
    pub channels: usize,
}

/// The statistics every normalising stage used (`None` for stages without normalisation).
pub type NetStats = Vec<Option<Vec<ChannelStats>>>;

/// Geometry of one axis of one stage.
#[derive(Clone, Copy, Debug)]
pub struct Axis {
    /// Length of the stage's input activation (before upsampling).
    pub n_in: usize,
    pub upsample: bool,
    pub pad: usize,
    pub k: usize,
    pub stride: usize,
    pub mode: PaddingMode,
}

impl Axis {
    fn n_up(&self) -> usize {
        if self.upsample {
            2 * self.n_in
        } else {
            self.n_in
        }
    }

    /// Output length, PyTorch's floor rule.
    pub fn n_out(&self) -> usize {
        (self.n_up() + 2 * self.pad - self.k) / self.stride + 1
    }

    /// For outputs `o0..o1`, the input index each row/column of the conv's window band reads
    /// (`None` = zero padding): padding and upsampling folded into one map.
    pub fn index_map(&self, o0: usize, o1: usize) -> Vec<Option<usize>> {
        let start = (o0 * self.stride) as isize - self.pad as isize;
        let len = (o1 - o0 - 1) * self.stride + self.k;
        (start..start + len as isize)
            .map(|u| {
                self.mode
                    .map(u, self.n_up())
                    .map(|v| if self.upsample { v / 2 } else { v })
            })
            .collect()
    }

    /// The smallest input range that outputs `o0..o1` read.
    pub fn input_hull(&self, o0: usize, o1: usize) -> (usize, usize) {
        let m = self.index_map(o0, o1);
        let lo = m.iter().flatten().min().copied().unwrap_or(0);
        let hi = m.iter().flatten().max().map_or(0, |v| v + 1);
        (lo, hi)
    }

    /// How far, in input pixels, a tile's window reaches past its own rows on either side.
    pub fn halo(&self) -> usize {
        let h = self.pad.max(self.k - 1 - self.pad.min(self.k - 1));
        if self.upsample { h.div_ceil(2) } else { h }
    }
}

/// Shapes of every stage for one input size.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Per stage: (rows axis, columns axis).
    pub axes: Vec<(Axis, Axis)>,
    /// Per stage: output `(c, h, w)`.
    pub out: Vec<(usize, usize, usize)>,
    /// Per stage: how many input pixels one output pixel spans (1, 2, 4, ...).
    pub div: Vec<usize>,
    /// For each stage output, the last stage that reads it.
    pub last_use: Vec<usize>,
}

/// The largest model file read: far above any tileable CNN's weights (an ONNX protobuf stops at 2 GiB),
/// and a bound on what a file that keeps growing can make us allocate.
pub const MAX_MODEL_BYTES: u64 = 4 << 30;

/// A model file's bytes: a regular file only (a FIFO, a device such as `/dev/zero` or a folder is refused
/// at once, symlinks followed), of at most [`MAX_MODEL_BYTES`], checked before it is read.
pub(crate) fn read_model_file(path: &Path) -> Result<Vec<u8>> {
    stdx::fs::read_regular(path, MAX_MODEL_BYTES).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl Net {
    /// Product of the strides: tile borders must fall on multiples of it.
    pub fn total_stride(&self) -> usize {
        self.stages.iter().map(|s| s.conv.stride).product()
    }

    /// Checks the network against an input size and derives every stage's shape.
    pub fn plan(&self, h: usize, w: usize) -> Result<Plan> {
        if h == 0 || w == 0 {
            return Err(Error::EmptyImage {
                width: w,
                height: h,
            });
        }
        let (mut ch, mut hh, mut ww) = (self.channels, h, w);
        let (mut down, mut up) = (1usize, 1usize);
        let mut plan = Plan {
            axes: vec![],
            out: vec![],
            div: vec![],
            last_use: (0..self.stages.len()).collect(),
        };
        for (i, s) in self.stages.iter().enumerate() {
            if s.conv.cin != ch {
                return Err(Error::Unsupported(format!(
                    "{} takes {} channels, gets {ch}",
                    s.name, s.conv.cin
                )));
            }
            let ax = |n| Axis {
                n_in: n,
                upsample: s.upsample,
                pad: s.pad,
                k: s.conv.k,
                stride: s.conv.stride,
                mode: self.padding,
            };
            let (ay, axx) = (ax(hh), ax(ww));
            for a in [ay, axx] {
                let too_small = a.n_up() + 2 * a.pad < a.k
                    || (self.padding == PaddingMode::Reflect && a.pad >= a.n_up());
                if too_small {
                    return Err(Error::ImageTooSmall {
                        width: w,
                        height: h,
                        layer: s.name.clone(),
                        pad: a.pad,
                    });
                }
            }
            if s.upsample {
                up *= 2;
            }
            down *= s.conv.stride;
            if up > down || down % up != 0 {
                return Err(Error::Unsupported(format!(
                    "{} upsamples past the input resolution",
                    s.name
                )));
            }
            if let Some(r) = s.residual {
                if r >= i || plan.out[r] != (s.conv.cout, ay.n_out(), axx.n_out()) {
                    return Err(Error::Unsupported(format!(
                        "{}: residual from stage {r} does not match",
                        s.name
                    )));
                }
                plan.last_use[r] = plan.last_use[r].max(i);
            }
            if i > 0 {
                plan.last_use[i - 1] = plan.last_use[i - 1].max(i);
            }
            ch = s.conv.cout;
            hh = ay.n_out();
            ww = axx.n_out();
            plan.axes.push((ay, axx));
            plan.out.push((ch, hh, ww));
            plan.div.push(down / up);
        }
        Ok(plan)
    }
}

/// Widths of a TransformerNet: conv1, conv2, conv3 (= residual) channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Widths(pub usize, pub usize, pub usize);

/// One stage of the PyTorch example's layout.
struct Spec {
    conv: String,
    norm: Option<String>,
    k: usize,
    stride: usize,
    upsample: bool,
    relu: bool,
    residual: Option<usize>,
}

/// The PyTorch example's modules, in forward order.
fn layout() -> Vec<Spec> {
    let spec = |conv: &str, norm: Option<&str>, k, stride, upsample, relu, residual| Spec {
        conv: conv.into(),
        norm: norm.map(Into::into),
        k,
        stride,
        upsample,
        relu,
        residual,
    };
    let mut v = vec![
        spec("conv1", Some("in1"), 9, 1, false, true, None),
        spec("conv2", Some("in2"), 3, 2, false, true, None),
        spec("conv3", Some("in3"), 3, 2, false, true, None),
    ];
    for r in 1..=5 {
        let block_input = v.len() - 1;
        v.push(spec(
            &format!("res{r}.conv1"),
            Some(&format!("res{r}.in1")),
            3,
            1,
            false,
            true,
            None,
        ));
        v.push(spec(
            &format!("res{r}.conv2"),
            Some(&format!("res{r}.in2")),
            3,
            1,
            false,
            false,
            Some(block_input),
        ));
    }
    v.push(spec("deconv1", Some("in4"), 3, 1, true, true, None));
    v.push(spec("deconv2", Some("in5"), 3, 1, true, true, None));
    v.push(spec("deconv3", None, 9, 1, false, false, None));
    v
}

/// (in, out) channels of each stage for the given widths.
fn channels(w: Widths) -> Vec<(usize, usize)> {
    let Widths(a, b, c) = w;
    let mut v = vec![(3, a), (a, b), (b, c)];
    v.extend(std::iter::repeat_n((c, c), 10));
    v.extend([(c, b), (b, a), (a, 3)]);
    v
}

/// Builds a TransformerNet from named tensors (`key -> (shape, data)`).
fn transformer_from(
    tensors: &mut HashMap<String, (Vec<usize>, Vec<f32>)>,
    path: &Path,
    padding: PaddingMode,
) -> Result<Net> {
    let missing = |key: &str| Error::MissingTensor {
        path: path.to_path_buf(),
        key: key.into(),
    };
    // The widths come from vectors that state them (the conv's bias, its norm's weight) before the
    // weight itself, so that a mis-shaped weight is reported against the shape it should have.
    let width = |conv: &str, norm: &str| -> Result<usize> {
        let vector = |key: String| match tensors.get(&key) {
            Some((shape, _)) if shape.len() == 1 && shape[0] > 0 => Some(shape[0]),
            _ => None,
        };
        let weight = format!("{conv}.conv2d.weight");
        let from_weight = match tensors.get(&weight) {
            Some((shape, _)) if shape.len() == 4 && shape[0] > 0 => Some(shape[0]),
            Some(_) => None,
            None => return Err(missing(&weight)),
        };
        vector(format!("{conv}.conv2d.bias"))
            .or_else(|| vector(format!("{norm}.weight")))
            .or(from_weight)
            .ok_or_else(|| Error::Format {
                path: path.to_path_buf(),
                reason: format!(
                    "cannot tell the width of {conv}: {conv}.conv2d.bias, {norm}.weight and {weight} all have unexpected shapes"
                ),
            })
    };
    let widths = Widths(
        width("conv1", "in1")?,
        width("conv2", "in2")?,
        width("conv3", "in3")?,
    );
    let mut take = |key: String, shape: Vec<usize>| -> Result<Vec<f32>> {
        let (found, data) = tensors.remove(&key).ok_or_else(|| missing(&key))?;
        if found != shape {
            return Err(Error::BadShape {
                path: path.to_path_buf(),
                key,
                expected: shape,
                found,
            });
        }
        Ok(data)
    };
    let mut stages = vec![];
    for (
        Spec {
            conv,
            norm,
            k,
            stride,
            upsample,
            relu,
            residual,
        },
        (cin, cout),
    ) in layout().into_iter().zip(channels(widths))
    {
        let weight = take(format!("{conv}.conv2d.weight"), vec![cout, cin, k, k])?;
        let bias = take(format!("{conv}.conv2d.bias"), vec![cout])?;
        let norm = match norm {
            Some(n) => {
                let gamma = take(format!("{n}.weight"), vec![cout])?;
                let beta = take(format!("{n}.bias"), vec![cout])?;
                Some(Norm {
                    gamma,
                    beta,
                    eps: 1e-5,
                })
            }
            None => None,
        };
        stages.push(Stage {
            name: conv,
            upsample,
            pad: k / 2,
            conv: Conv2d {
                cin,
                cout,
                k,
                stride,
                weight,
                bias,
            },
            norm,
            relu,
            residual,
        });
    }
    if let Some(key) = tensors.keys().min() {
        return Err(Error::UnexpectedTensor {
            path: path.to_path_buf(),
            key: key.clone(),
        });
    }
    Ok(Net {
        stages,
        padding,
        channels: 3,
    })
}

/// The safetensors name of a dtype (`F16`, `I64`, ...).
fn dtype_name(d: safetensors::Dtype) -> String {
    use safetensors::Dtype::*;
    match d {
        BOOL => "BOOL",
        U8 => "U8",
        I8 => "I8",
        I16 => "I16",
        U16 => "U16",
        F16 => "F16",
        BF16 => "BF16",
        I32 => "I32",
        U32 => "U32",
        F32 => "F32",
        F64 => "F64",
        I64 => "I64",
        U64 => "U64",
        _ => "an unsupported dtype",
    }
    .to_string()
}

/// Keys a PyTorch state dict may carry that inference with instance statistics does not use.
fn skipped(key: &str) -> bool {
    key.ends_with(".running_mean")
        || key.ends_with(".running_var")
        || key.ends_with(".num_batches_tracked")
}

impl Net {
    /// Loads a TransformerNet from a safetensors file with the PyTorch example's state-dict keys
    /// (`conv1.conv2d.weight`, `in1.weight`, `res1.conv1.conv2d.weight`, `deconv3.conv2d.bias`, ...).
    /// Widths follow from the tensor shapes; `running_mean`/`running_var` keys are skipped.
    pub fn load_transformer(path: &Path, padding: PaddingMode) -> Result<Net> {
        let bytes = read_model_file(path)?;
        Net::transformer_from_bytes(&bytes, path, padding)
    }

    /// As [`Net::load_transformer`], from bytes already read (`path` names them in errors).
    pub fn transformer_from_bytes(bytes: &[u8], path: &Path, padding: PaddingMode) -> Result<Net> {
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| Error::Format {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let mut tensors = HashMap::new();
        for (key, view) in st.tensors() {
            if skipped(&key) {
                continue;
            }
            if view.dtype() != safetensors::Dtype::F32 {
                return Err(Error::BadDtype {
                    path: path.to_path_buf(),
                    key,
                    found: dtype_name(view.dtype()),
                });
            }
            let data: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            tensors.insert(key, (view.shape().to_vec(), data));
        }
        transformer_from(&mut tensors, path, padding)
    }

    /// A TransformerNet with seeded random weights (He-scaled convolutions, norm affine near identity).
    pub fn random_transformer(widths: Widths, seed: u64, padding: PaddingMode) -> Net {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        let mut tensors = HashMap::new();
        for (Spec { conv, norm, k, .. }, (cin, cout)) in layout().into_iter().zip(channels(widths))
        {
            let scale = (3.0 / (cin * k * k) as f64).sqrt();
            let w: Vec<f32> = (0..cout * cin * k * k)
                .map(|_| (rnd() * scale) as f32)
                .collect();
            tensors.insert(format!("{conv}.conv2d.weight"), (vec![cout, cin, k, k], w));
            let b: Vec<f32> = (0..cout).map(|_| (rnd() * 0.1) as f32).collect();
            tensors.insert(format!("{conv}.conv2d.bias"), (vec![cout], b));
            if let Some(n) = norm {
                let g: Vec<f32> = (0..cout).map(|_| (1.0 + 0.3 * rnd()) as f32).collect();
                let b: Vec<f32> = (0..cout).map(|_| (0.3 * rnd()) as f32).collect();
                tensors.insert(format!("{n}.weight"), (vec![cout], g));
                tensors.insert(format!("{n}.bias"), (vec![cout], b));
            }
        }
        transformer_from(&mut tensors, Path::new("<random>"), padding).expect("layout is complete")
    }

    /// The widths (conv1, conv2, conv3 output channels) of a TransformerNet.
    pub fn widths(&self) -> Widths {
        let c = |i: usize| self.stages.get(i).map_or(0, |s| s.conv.cout);
        Widths(c(0), c(1), c(2))
    }

    pub fn parameters(&self) -> usize {
        self.stages
            .iter()
            .map(|s| {
                s.conv.weight.len()
                    + s.conv.bias.len()
                    + s.norm.as_ref().map_or(0, |n| n.gamma.len() + n.beta.len())
            })
            .sum()
    }
}
