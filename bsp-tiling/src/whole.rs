//! The whole-image pass: every stage over the whole image at once. It is the reference every tiled mode
//! is checked against, [`Mode::Whole`](crate::Mode::Whole), and (per tile) the naive baseline; on a
//! device backend it must fit the memory budget, which [`whole_peak`] counts first.

use crate::backend::{Backend, Pad};
use crate::error::{Error, Result};
use crate::model::{Net, NetStats, Plan};
use crate::tensor::Tensor;

impl Net {
    /// Runs the whole image at once: the reference every tiled mode is checked against.
    ///
    /// With `fixed`, normalising stages use those statistics instead of their own (the sampled mode's
    /// statistics source). Returns the output and the statistics each normalising stage used. On a device
    /// backend the whole pass must fit its memory budget ([`whole_peak`]), checked first.
    pub fn forward_whole<B: Backend>(
        &self,
        backend: &B,
        x: &Tensor,
        threads: usize,
        fixed: Option<&NetStats>,
    ) -> Result<(Tensor, NetStats)> {
        self.forward_tensor(backend, x.clone(), threads, fixed)
    }

    /// [`Net::forward_whole`] taking the input by value (no copy on the CPU).
    pub fn forward_tensor<B: Backend>(
        &self,
        backend: &B,
        x: Tensor,
        threads: usize,
        fixed: Option<&NetStats>,
    ) -> Result<(Tensor, NetStats)> {
        if x.c != self.channels {
            return Err(Error::Channels {
                expected: self.channels,
                found: x.c,
            });
        }
        let plan = self.plan(x.h, x.w)?;
        if let Some(m) = backend.meter() {
            let needed = m.used() + whole_peak(backend, self, &plan, x.h, x.w);
            if needed > m.budget() {
                return Err(Error::DeviceBudget {
                    what: format!("the whole-image pass over {}x{}", x.w, x.h),
                    needed,
                    budget: m.budget(),
                });
            }
        }
        let weights = self.load_weights(backend)?;
        let xb = backend.upload(x)?;
        let (y, used) = self.forward_buf(backend, &weights, &plan, xb, threads, fixed)?;
        Ok((backend.download(y)?, used))
    }

    /// The whole-image pass on the backend's own activations.
    pub(crate) fn forward_buf<B: Backend>(
        &self,
        backend: &B,
        weights: &[B::Weights],
        plan: &Plan,
        x: B::Buf,
        threads: usize,
        fixed: Option<&NetStats>,
    ) -> Result<(B::Buf, NetStats)> {
        let mut image = Some(x);
        let mut outs: Vec<Option<B::Buf>> = (0..self.stages.len()).map(|_| None).collect();
        let mut used: NetStats = vec![None; self.stages.len()];
        for (i, s) in self.stages.iter().enumerate() {
            let input = if i == 0 {
                image.as_ref().expect("the image feeds stage 0")
            } else {
                outs[i - 1].as_ref().expect("live")
            };
            let padded = if s.upsample {
                let up = backend.upsample_nearest2x(input)?;
                backend.pad(&up, Pad::all(s.pad), self.padding)?
            } else {
                backend.pad(input, Pad::all(s.pad), self.padding)?
            };
            let mut y = backend.conv2d_valid(&padded, &s.conv, &weights[i], threads)?;
            drop(padded);
            image = None;
            if let Some(norm) = &s.norm {
                let st = match fixed.and_then(|f| f.get(i).cloned().flatten()) {
                    Some(st) => st,
                    None => backend.channel_stats(&y)?,
                };
                backend.normalize(&mut y, &st, norm, s.relu)?;
                used[i] = Some(st);
            } else if s.relu {
                backend.relu(&mut y)?;
            }
            if let Some(r) = s.residual {
                backend.add(&mut y, outs[r].as_ref().expect("live"))?;
            }
            outs[i] = Some(y);
            for (j, o) in outs.iter_mut().enumerate().take(i) {
                if plan.last_use[j] <= i {
                    *o = None;
                }
            }
        }
        let out = outs.pop().flatten().expect("at least one stage");
        Ok((out, used))
    }
}

/// Device memory the whole-image forward pass ([`Net::forward_whole`]) takes at its peak on `backend`
/// for an `h × w` input: the weights, the outputs still to be read, and each stage's input, upsampled and
/// padded copies, output and scratch.
pub fn whole_peak<B: Backend>(backend: &B, net: &Net, plan: &Plan, h: usize, w: usize) -> u64 {
    let weights: u64 = net
        .stages
        .iter()
        .map(|s| backend.weight_bytes(&s.conv))
        .sum();
    let out_bytes = |j: usize| {
        let (c, hh, ww) = plan.out[j];
        Tensor::bytes(c, hh, ww)
    };
    (0..net.stages.len())
        .map(|i| {
            let s = &net.stages[i];
            let (ay, ax) = plan.axes[i];
            // Outputs alive during stage i (the stage's input among them; the image itself at stage 0).
            let alive: u64 = (0..i)
                .filter(|&j| plan.last_use[j] >= i)
                .map(out_bytes)
                .sum::<u64>()
                + if i == 0 {
                    Tensor::bytes(net.channels, h, w)
                } else {
                    0
                };
            let c = s.conv.cin;
            let (uh, uw) = (
                ay.n_in * if s.upsample { 2 } else { 1 },
                ax.n_in * if s.upsample { 2 } else { 1 },
            );
            let up = if s.upsample {
                Tensor::bytes(c, uh, uw)
            } else {
                0
            };
            let padded = Tensor::bytes(c, uh + 2 * s.pad, uw + 2 * s.pad);
            let (_, ho, wo) = plan.out[i];
            let out = out_bytes(i);
            let work = (up + padded)
                .max(padded + out + backend.conv_scratch_bytes(&s.conv, ho, wo))
                .max(
                    out + backend.stats_scratch_bytes(s.conv.cout, ho * wo)
                        + backend.norm_scratch_bytes(s.conv.cout),
                );
            weights + alive + work
        })
        .max()
        .unwrap_or(weights)
}
