//! One image shared among ranks (threads of this process joined by `LocalRanks`, the same engine path
//! as processes joined by torch.distributed or JAX): rank 0's output has the bits of a single process's
//! in every mode, on the ONNX test models (skips, GroupNorm, strides, pixel shuffle, tiles narrower than
//! the halos) and a TransformerNet, in RAM and spilled; every rank applies the same statistics; a rank
//! that fails stops every other one with an error naming it.

mod common;

use bsp_tiling::field::{OutputSink, Sink};
use bsp_tiling::testing::DeviceSim;
use bsp_tiling::{
    Budget, CpuBackend, Error, Graph, GraphOps, LocalRanks, Mode, Options, Precision, Ranks,
    RunInfo, Tensor, load_onnx, run,
};
use std::path::PathBuf;

fn load(name: &str) -> Graph {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/onnx/{name}.onnx"));
    load_onnx(&p).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn opts(mode: Mode, tile: usize, budget: &Budget) -> Options {
    Options {
        mode,
        tile,
        threads: 2,
        budget: budget.clone(),
        ranks: None,
    }
}

fn alone(g: &Graph, x: &Tensor, o: &Options) -> bsp_tiling::Result<(Tensor, RunInfo)> {
    let (c, h, w) = g.plan(x.h, x.w)?.shape[g.output];
    let sink = OutputSink::try_f32(c, h, w)?;
    let info = run(&CpuBackend, g, x, o, &sink)?;
    Ok((sink.finish().into_tensor()?, info))
}

/// Every rank's result: its sink's contents and what the run reported. `input_of(rank)` and
/// `opts_of(rank)` let a test give one rank something else.
fn on_ranks(
    g: &Graph,
    size: usize,
    input_of: &(dyn Fn(usize) -> Tensor + Sync),
    opts_of: &(dyn Fn(usize) -> Options + Sync),
    sink_of: &(dyn Fn(usize, (usize, usize, usize)) -> Box<dyn Sink> + Sync),
) -> Vec<bsp_tiling::Result<RunInfo>> {
    on_ranks_on(g, size, &|_| CpuBackend, input_of, opts_of, sink_of)
}

/// [`on_ranks`] with rank r's run on `backend_of(r)`.
fn on_ranks_on<B: GraphOps>(
    g: &Graph,
    size: usize,
    backend_of: &(dyn Fn(usize) -> B + Sync),
    input_of: &(dyn Fn(usize) -> Tensor + Sync),
    opts_of: &(dyn Fn(usize) -> Options + Sync),
    sink_of: &(dyn Fn(usize, (usize, usize, usize)) -> Box<dyn Sink> + Sync),
) -> Vec<bsp_tiling::Result<RunInfo>> {
    let group = LocalRanks::group(size);
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    let x = input_of(r);
                    let o = Options {
                        ranks: Some(Ranks::new(c)?),
                        ..opts_of(r)
                    };
                    let shape = g.plan(x.h, x.w)?.shape[g.output];
                    let sink = sink_of(r, shape);
                    run(&backend_of(r), g, &x, &o, sink.as_ref())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A sink that keeps what it is given (in the order given) for the test to read afterwards.
struct Kept(std::sync::Mutex<Vec<(usize, usize, Tensor)>>);

impl Sink for Kept {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> bsp_tiling::Result<()> {
        self.0.lock().unwrap().push((y0, x0, t.clone()));
        Ok(())
    }
}

/// Rank 0's output and every rank's report, from `size` ranks.
fn shared(g: &Graph, x: &Tensor, o: &Options, size: usize) -> (Tensor, Vec<RunInfo>) {
    shared_on(g, x, o, size, &|_| CpuBackend)
}

/// [`shared`] with rank r's run on `backend_of(r)`.
fn shared_on<B: GraphOps>(
    g: &Graph,
    x: &Tensor,
    o: &Options,
    size: usize,
    backend_of: &(dyn Fn(usize) -> B + Sync),
) -> (Tensor, Vec<RunInfo>) {
    try_shared_on(g, x, o, size, backend_of)
        .unwrap_or_else(|(r, e)| panic!("{} {:?} rank {r}/{size}: {e}", g.name, o.mode))
}

/// [`shared_on`], or the first rank that failed and its error.
fn try_shared_on<B: GraphOps>(
    g: &Graph,
    x: &Tensor,
    o: &Options,
    size: usize,
    backend_of: &(dyn Fn(usize) -> B + Sync),
) -> Result<(Tensor, Vec<RunInfo>), (usize, Error)> {
    let kept: Vec<std::sync::Arc<Kept>> = (0..size)
        .map(|_| std::sync::Arc::new(Kept(Default::default())))
        .collect();
    struct Shared(std::sync::Arc<Kept>);
    impl Sink for Shared {
        fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> bsp_tiling::Result<()> {
            self.0.put_tile(y0, x0, t)
        }
    }
    let infos = on_ranks_on(
        g,
        size,
        backend_of,
        &|_| x.clone(),
        &|_| o.clone(),
        &|r, _| Box::new(Shared(kept[r].clone())),
    );
    let infos: Vec<RunInfo> = infos
        .into_iter()
        .enumerate()
        .map(|(r, i)| i.map_err(|e| (r, e)))
        .collect::<Result<_, _>>()?;
    for (r, k) in kept.iter().enumerate().skip(1) {
        assert!(
            k.0.lock().unwrap().is_empty(),
            "rank {r} of {size} wrote its sink: only rank 0 writes"
        );
    }
    let (c, h, w) = g.plan(x.h, x.w).unwrap().shape[g.output];
    let sink = OutputSink::try_f32(c, h, w).unwrap();
    for (y0, x0, t) in kept[0].0.lock().unwrap().drain(..) {
        sink.put_tile(y0, x0, &t).unwrap();
    }
    Ok((sink.finish().into_tensor().unwrap(), infos))
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    (a.c, a.h, a.w) == (b.c, b.h, b.w)
        && a.data
            .iter()
            .zip(&b.data)
            .all(|(p, q)| p.to_bits() == q.to_bits())
}

/// Rank 0's output on each of `sizes` ranks has the bits of one process's, and every rank applied its
/// statistics; a run one process refuses is refused on every rank, with the same words.
fn check(g: &Graph, x: &Tensor, o: &Options, sizes: &[usize]) {
    let (want, info) = match alone(g, x, o) {
        Ok(r) => r,
        Err(e) => {
            for &size in sizes {
                let got = on_ranks(g, size, &|_| x.clone(), &|_| o.clone(), &|_, _| {
                    Box::new(Kept(Default::default()))
                });
                for (r, result) in got.iter().enumerate() {
                    let Err(theirs) = result else {
                        panic!(
                            "{} {:?}: one process refuses ({e}), rank {r} of {size} ran",
                            g.name, o.mode
                        )
                    };
                    assert!(
                        theirs.to_string().contains(&e.to_string()),
                        "{} {:?} rank {r} of {size}: {theirs}, not {e}",
                        g.name,
                        o.mode
                    );
                }
            }
            return;
        }
    };
    for &size in sizes {
        let (got, infos) = shared(g, x, o, size);
        assert!(
            same_bits(&got, &want),
            "{} {:?} tile {} on {size} ranks: other bits than one process",
            g.name,
            o.mode,
            o.tile
        );
        for (r, i) in infos.iter().enumerate() {
            assert_eq!(
                i.stats, info.stats,
                "{} {:?} on {size} ranks: rank {r} applied other statistics",
                g.name, o.mode
            );
        }
    }
}

#[test]
fn every_mode_on_ranks_gives_the_bits_of_one_process() {
    let b = Budget::default();
    for (name, tile, h, w) in [
        ("unet_gn", 8, 40, 56),
        ("ops_mix", 4, 40, 50),
        ("resnet_fcn", 8, 48, 40),
        ("esrgan_x4", 4, 19, 26),
    ] {
        let g = load(name);
        let x = common::noise_image(g.channels, h, w, 11);
        for mode in [
            Mode::Exact,
            Mode::Recompute,
            Mode::Sampled(2),
            Mode::Naive,
            Mode::Whole,
        ] {
            check(&g, &x, &opts(mode, tile, &b), &[1, 2, 3]);
        }
        // More ranks than rows of tiles: bands narrower than a tile row, some ranks with one tile.
        check(&g, &x, &opts(Mode::Exact, tile, &b), &[7]);
    }
}

#[test]
fn a_transformer_net_on_ranks_gives_the_bits_of_one_process() {
    let net = common::model("candy_nc8.safetensors");
    let g = Graph::from_net(&net);
    let x = common::noise_image(3, 72, 100, 4);
    let b = Budget::default();
    for size in [2, 4] {
        check(&g, &x, &opts(Mode::Exact, 32, &b), &[size]);
    }
    check(&g, &x, &opts(Mode::Recompute, 32, &b), &[3]);
}

#[test]
fn spilled_values_on_ranks_give_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    for (name, tile, h, w) in [("unet_gn", 16, 48, 64), ("ops_mix", 12, 40, 50)] {
        let g = load(name);
        let x = common::noise_image(g.channels, h, w, 2);
        let spill = Budget {
            ram: bsp_tiling::working_set(&g, &x, Mode::Exact, tile, 2).unwrap(),
            disk: None,
            spill_dir: dir.path().to_path_buf(),
        };
        let o = opts(Mode::Exact, tile, &spill);
        let (_, info) = alone(&g, &x, &o).unwrap();
        assert!(info.spilled_layers > 0, "{name}: nothing spilled");
        check(&g, &x, &o, &[2, 3]);
    }
}

/// Each rank on a simulated device of its own that keeps the stored values: its own tiles and the
/// rectangles of the others' that it reads stay in device memory, the exchange reads and fills them
/// there, and rank 0's output has the bits of one process on the CPU; fewer bytes cross each rank's bus
/// than with every value on the host, and no lease is left behind. A device budget that holds only some
/// values moves kept ones to the host mid-run, received rectangles included, with the same bits.
#[test]
fn values_kept_on_devices_on_ranks_give_the_bits_of_one_process() {
    let b = Budget::default();
    for (name, tile, h, w) in [
        ("unet_gn", 8, 40, 56),
        ("ops_mix", 4, 40, 50),
        ("resnet_fcn", 8, 48, 40),
    ] {
        let g = load(name);
        let x = common::noise_image(g.channels, h, w, 5);
        let o = opts(Mode::Exact, tile, &b);
        let (want, _) = alone(&g, &x, &o).unwrap();
        for size in [2, 3] {
            let sims = |keeps: bool, budget: u64| -> Vec<DeviceSim> {
                (0..size)
                    .map(|_| {
                        let mut sim = DeviceSim::new(budget, Precision::F32);
                        sim.keeps = keeps;
                        sim
                    })
                    .collect()
            };
            let on = |sims: &[DeviceSim], what: &str| -> Vec<RunInfo> {
                let (got, infos) = shared_on(&g, &x, &o, size, &|r| sims[r].clone());
                assert!(
                    same_bits(&got, &want),
                    "{name} on {size} ranks, {what}: other bits than one process"
                );
                for (r, sim) in sims.iter().enumerate() {
                    assert_eq!(
                        sim.meter().used(),
                        0,
                        "{name} rank {r}, {what}: leases left"
                    );
                }
                infos
            };
            let kept = on(&sims(true, u64::MAX), "values kept");
            let host = on(&sims(false, u64::MAX), "values on the host");
            for (r, (k, h)) in kept.iter().zip(&host).enumerate() {
                eprintln!(
                    "{name} rank {r} of {size}: {} values kept, {} bytes copied ({} with values on \
                     the host), device peak {} ({})",
                    k.kept_values,
                    k.device_copied_bytes,
                    h.device_copied_bytes,
                    k.device_peak_bytes,
                    h.device_peak_bytes
                );
                assert!(
                    k.kept_values > 0 && k.values_moved_to_host == 0 && h.kept_values == 0,
                    "{name} rank {r} of {size}: {} kept ({} moved), {} kept on the host run",
                    k.kept_values,
                    k.values_moved_to_host,
                    h.kept_values
                );
                assert!(
                    k.device_copied_bytes * 2 < h.device_copied_bytes,
                    "{name} rank {r} of {size}: {} bytes copied kept, {} on the host",
                    k.device_copied_bytes,
                    h.device_copied_bytes
                );
            }
            // Budgets down from a kept run's peak until one moves a kept value to the host.
            let peak = kept.iter().map(|i| i.device_peak_bytes).max().unwrap();
            let mut budget = peak;
            let moved = loop {
                budget = budget * 7 / 8;
                let devices = sims(true, budget);
                let (got, infos) = match try_shared_on(&g, &x, &o, size, &|r| devices[r].clone()) {
                    Ok(r) => r,
                    // A budget the working sets do not fit: every budget above it moved nothing.
                    Err((_, Error::DeviceBudget { .. })) => break false,
                    Err((r, e)) => panic!("{name} rank {r} of {size}, budget {budget}: {e}"),
                };
                assert!(
                    same_bits(&got, &want),
                    "{name} on {size} ranks, budget {budget}"
                );
                if infos.iter().any(|i| i.values_moved_to_host > 0) {
                    break true;
                }
            };
            assert!(
                moved,
                "{name} on {size} ranks: no budget moved a kept value to the host"
            );
        }
    }
}

/// A sink that fails at its first tile (a full disk on rank 0).
struct Failing;

impl Sink for Failing {
    fn put_tile(&self, _: usize, _: usize, _: &Tensor) -> bsp_tiling::Result<()> {
        Err(Error::Unsupported("the disk is full".into()))
    }
}

#[test]
fn a_failing_rank_stops_every_other_one_naming_it() {
    let g = load("unet_gn");
    let x = common::noise_image(3, 40, 56, 1);
    let b = Budget::default();
    let keep = |_: usize, _| Box::new(Kept(Default::default())) as Box<dyn Sink>;
    for mode in [Mode::Exact, Mode::Recompute, Mode::Naive] {
        // Rank 0's output fails: everyone stops, the others naming rank 0.
        let sink_of = |r: usize, s| {
            if r == 0 {
                Box::new(Failing) as Box<dyn Sink>
            } else {
                keep(r, s)
            }
        };
        let got = on_ranks(&g, 3, &|_| x.clone(), &|_| opts(mode, 8, &b), &sink_of);
        assert!(
            matches!(&got[0], Err(Error::Unsupported(m)) if m.contains("disk is full")),
            "{mode:?}: rank 0: {:?}",
            got[0].as_ref().err()
        );
        for r in [1, 2] {
            assert!(
                matches!(&got[r], Err(Error::RankFailed { rank: 0, size: 3, message }) if message.contains("disk is full")),
                "{mode:?}: rank {r}: {:?}",
                got[r].as_ref().err()
            );
        }
    }
    // Rank 2's input has the wrong channels: refused there before any tile, and the others say so.
    let got = on_ranks(
        &g,
        3,
        &|r| common::noise_image(if r == 2 { 1 } else { 3 }, 40, 56, 1),
        &|_| opts(Mode::Exact, 8, &b),
        &keep,
    );
    assert!(
        matches!(&got[2], Err(Error::Channels { .. })),
        "{:?}",
        got[2]
    );
    for r in [0, 1] {
        assert!(
            matches!(&got[r], Err(Error::RankFailed { rank: 2, message, .. }) if message.contains("channels")),
            "rank {r}: {:?}",
            got[r].as_ref().err()
        );
    }
    // Ranks asked for different runs: every one stops with an error, none waits for ever.
    let got = on_ranks(
        &g,
        2,
        &|_| x.clone(),
        &|r| opts(if r == 0 { Mode::Exact } else { Mode::Recompute }, 8, &b),
        &keep,
    );
    for (r, result) in got.iter().enumerate() {
        assert!(
            matches!(
                result,
                Err(Error::Collective { .. } | Error::RankFailed { .. })
            ),
            "rank {r}: {:?}",
            result.as_ref().err()
        );
    }
}

#[test]
fn a_rank_outside_its_group_is_refused() {
    struct Bad;
    impl bsp_tiling::Collective for Bad {
        fn rank(&self) -> usize {
            2
        }
        fn size(&self) -> usize {
            2
        }
        fn all_gather(&self, _: Vec<u8>) -> Result<Vec<Vec<u8>>, String> {
            Err("never called".into())
        }
    }
    let e = Ranks::new(std::sync::Arc::new(Bad)).unwrap_err();
    assert!(e.to_string().contains("rank 2 of 2"), "{e}");
}

/// `Collective::exchange` as every collective without point-to-point sends has it (through all-gather):
/// each rank receives, in rank order, exactly the part each rank addressed to it, empty ones included.
#[test]
fn an_exchange_delivers_each_part_to_its_rank_alone() {
    let size = 4;
    let got: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = LocalRanks::group(size)
            .into_iter()
            .enumerate()
            .map(|(me, c)| {
                s.spawn(move || {
                    // Rank 2 sends nothing to anyone; the others a part naming sender and receiver.
                    let parts = (0..size)
                        .map(|r| match me {
                            2 => vec![],
                            _ => format!("{me}->{r}").into_bytes(),
                        })
                        .collect();
                    c.exchange(parts).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (me, received) in got.iter().enumerate() {
        assert_eq!(received.len(), size);
        for (from, part) in received.iter().enumerate() {
            let want = match from {
                2 => String::new(),
                _ => format!("{from}->{me}"),
            };
            assert_eq!(String::from_utf8_lossy(part), want, "rank {me} from {from}");
        }
    }
}
