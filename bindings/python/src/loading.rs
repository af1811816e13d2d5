//! `l3toolkit.Loader` and `l3toolkit.Batch`: the loader's pipeline as a Python iterator.
//!
//! The Rust loader runs its threads on its own; `__next__` waits for the next batch in short slices with
//! the GIL released and checks for signals between them, so other Python threads keep running and
//! Ctrl-C raises `KeyboardInterrupt` at once — after stopping and joining every pipeline thread. A
//! stopped loader (interrupted, failed, `close()`d, moved by `set_epoch` / `load_state_dict`) restarts
//! from its exact position the next time a batch is asked for.

use crate::errors::{Failure, Kind, detached, raise};
use crate::tensor::{Masks, Tensor};
use loader::{Crop, Dataset, LoaderOptions, LoaderState, Next, Order, ThreadMonitor, open_dataset};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long one wait for a batch lasts before signals are checked again.
const SLICE: Duration = Duration::from_millis(50);

/// Version of the `state_dict()` layout.
const STATE_VERSION: u32 = LoaderState::VERSION;

/// One batch: ``images`` (a :class:`Tensor`, zero-copy through DLPack), ``labels`` and ``indices``
/// (``int64`` NumPy arrays: class labels and dataset indices of the samples), ``epoch`` and ``index``
/// (its position within the epoch).
#[pyclass(frozen, module = "l3toolkit")]
pub struct Batch {
    /// The samples: ``(N, 3, H, W)`` or ``(N, H, W, 3)``.
    #[pyo3(get)]
    images: Py<Tensor>,
    /// Class label of each sample (``int64``).
    #[pyo3(get)]
    labels: Py<PyArray1<i64>>,
    /// Dataset index of each sample (``int64``).
    #[pyo3(get)]
    indices: Py<PyArray1<i64>>,
    /// The epoch this batch belongs to.
    #[pyo3(get)]
    epoch: usize,
    /// Position of this batch within its epoch (0-based).
    #[pyo3(get)]
    index: usize,
    /// Items left out of this batch as ``(dataset index, reason)`` (only with ``skip_errors=True``), after
    /// those of the batches just before it whose every item was skipped: such batches are never
    /// delivered.
    #[pyo3(get)]
    skipped: Vec<(usize, String)>,
    /// Seconds the consumer waited for this batch.
    #[pyo3(get)]
    wait: f64,
    /// Window of each sample in source pixels: ``(N, 4)`` ``int64`` rows of top, left, height, width.
    #[pyo3(get)]
    windows: Py<PyArray2<i64>>,
    /// Whether each sample is mirrored left-right (``(N,)`` ``bool``).
    #[pyo3(get)]
    flipped: Py<PyArray1<bool>>,
    /// Valid height and width of each sample (``(N, 2)`` ``int64``); the rest is padding.
    #[pyo3(get)]
    sizes: Py<PyArray2<i64>>,
    /// Each sample's label map (a :class:`Masks`, ``(N, H, W)``), with ``masks=``; else ``None``.
    #[pyo3(get)]
    masks: Option<Py<Masks>>,
    /// Each sample's boxes, with ``boxes=``: a list of N ``float32`` arrays ``(K, 4)``, x1 y1 x2 y2 in
    /// output pixels; else ``None``.
    #[pyo3(get)]
    boxes: Option<Py<PyList>>,
    /// The category id of each box, beside ``boxes``: a list of N ``int64`` arrays ``(K,)``.
    #[pyo3(get)]
    box_labels: Option<Py<PyList>>,
    len: usize,
}

impl Batch {
    fn new(py: Python<'_>, b: loader::Batch) -> PyResult<Batch> {
        let len = b.len();
        let windows: Vec<i64> = b
            .windows()
            .iter()
            .flat_map(|r| [r.y, r.x, r.h, r.w].map(i64::from))
            .collect();
        let sizes: Vec<i64> = b
            .sizes()
            .iter()
            .flat_map(|&(h, w)| [h, w].map(i64::from))
            .collect();
        let flipped = b.flipped();
        let loader::Batch {
            epoch,
            index,
            pixels,
            labels,
            ids,
            skipped,
            wait,
            masks,
            boxes,
            box_labels,
            ..
        } = b;
        let masks = masks.map(|m| Py::new(py, Masks::new(m))).transpose()?;
        let boxes = boxes
            .map(|all| -> PyResult<Py<PyList>> {
                let arrays = all
                    .into_iter()
                    .map(|b| {
                        let k = b.len();
                        let flat: Vec<f32> = b.into_iter().flatten().collect();
                        PyArray1::from_vec(py, flat).reshape([k, 4])
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, arrays)?.unbind())
            })
            .transpose()?;
        let box_labels = box_labels
            .map(|all| -> PyResult<Py<PyList>> {
                let arrays = all.into_iter().map(|l| PyArray1::from_vec(py, l));
                Ok(PyList::new(py, arrays)?.unbind())
            })
            .transpose()?;
        let labels: Vec<i64> = labels.into_iter().map(i64::from).collect();
        let ids: Vec<i64> = ids.into_iter().map(|i| i as i64).collect();
        Ok(Batch {
            images: Py::new(py, Tensor::new(pixels))?,
            labels: PyArray1::from_vec(py, labels).unbind(),
            indices: PyArray1::from_vec(py, ids).unbind(),
            epoch,
            index,
            skipped,
            wait: wait.as_secs_f64(),
            windows: PyArray1::from_vec(py, windows).reshape([len, 4])?.unbind(),
            flipped: PyArray1::from_vec(py, flipped).unbind(),
            sizes: PyArray1::from_vec(py, sizes).reshape([len, 2])?.unbind(),
            masks,
            boxes,
            box_labels,
            len,
        })
    }
}

#[pymethods]
impl Batch {
    /// Samples in the batch.
    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!(
            "Batch(epoch={}, index={}, len={})",
            self.epoch, self.index, self.len
        )
    }
}

/// The options recorded in `state_dict()` besides the position: what decides every batch's contents,
/// so that a resume with other options is refused rather than silently different. Lists, not tuples,
/// so that the state survives a JSON round trip.
#[derive(Clone, Debug)]
struct Recorded {
    /// `None` for whole images.
    crop: Option<(u32, u32)>,
    random_crop: bool,
    flip: bool,
    shuffle: bool,
    drop_last: bool,
    layout: &'static str,
    dtype: &'static str,
    mean: Option<[f32; 3]>,
    std: Option<[f32; 3]>,
    sampler: &'static str,
    /// The resampling recipe.
    recipe: vocab::Recipe,
    interpolation: String,
    fill: u8,
    channels: u8,
    /// The masks and boxes options (empty without targets).
    targets: String,
}

impl Recorded {
    fn of(o: &LoaderOptions) -> Recorded {
        Recorded {
            crop: (!o.sample.recipe.is_whole()).then_some((o.sample.height, o.sample.width)),
            random_crop: o.sample.crop == Crop::Random,
            flip: o.sample.hflip,
            shuffle: o.shuffle,
            drop_last: o.drop_last,
            layout: o.sample.layout.name(),
            dtype: o.sample.dtype.name(),
            mean: o.sample.normalize.map(|n| n.mean),
            std: o.sample.normalize.map(|n| n.std),
            sampler: match o.order {
                Order::Seeded => "uniform",
                Order::Liquid { .. } => "liquid",
            },
            recipe: o.sample.recipe,
            interpolation: o.sample.interpolation.to_string(),
            fill: o.sample.fill,
            channels: o.sample.channels,
            targets: o.targets.contents(),
        }
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("crop", self.crop.map(|c| [c.0, c.1]))?;
        d.set_item("random_crop", self.random_crop)?;
        d.set_item("flip", self.flip)?;
        d.set_item("shuffle", self.shuffle)?;
        d.set_item("drop_last", self.drop_last)?;
        d.set_item("layout", self.layout)?;
        d.set_item("dtype", self.dtype)?;
        d.set_item("mean", self.mean)?;
        d.set_item("std", self.std)?;
        d.set_item("sampler", self.sampler)?;
        // The recipe's options as text, the way states have always recorded them; whole images
        // record their resize, jitter and max_size under the same keys (crop is None).
        let (resize, jitter, max_size) = match self.recipe {
            vocab::Recipe::Whole(w) => (w.shorter, w.jitter, w.max_size),
            vocab::Recipe::Resize { shorter } => (Some(shorter), None, None),
            vocab::Recipe::Jitter { range } => (None, Some(range), None),
            _ => (None, None, None),
        };
        let scale = match self.recipe.option() {
            Some(("scale", v)) => Some(v),
            _ => None,
        };
        d.set_item("scale", scale)?;
        d.set_item("resize", resize.map(|v| v.to_string()))?;
        d.set_item("jitter", jitter.map(|r| format!("{},{}", r[0], r[1])))?;
        d.set_item("max_size", max_size)?;
        d.set_item("interpolation", &self.interpolation)?;
        d.set_item("fill", self.fill)?;
        d.set_item("channels", self.channels)?;
        d.set_item("targets", &self.targets)?;
        Ok(d)
    }
}

/// The running pipeline (if any) and where a restart begins.
struct Run {
    loader: Option<loader::Loader>,
    /// The next batch to deliver when `loader` is `None`.
    position: LoaderState,
    /// One-epoch-per-iteration mode: the epoch just ended; `__next__` stops until `__iter__` is called.
    epoch_done: bool,
    /// Counts the threads of the latest pipeline, joined or not.
    monitor: ThreadMonitor,
    /// The masks and boxes, paired once for every restart.
    targets: Option<Arc<loader::targets::Targets>>,
}

impl Run {
    fn state(&self) -> LoaderState {
        self.loader
            .as_ref()
            .map_or_else(|| self.position.clone(), |l| l.state())
    }

    /// Stops the pipeline (joining its threads), remembering its position.
    fn stop(&mut self) {
        if let Some(l) = self.loader.take() {
            self.position = l.state();
        }
    }

    /// Moves to `state`, restarting the pipeline there.
    fn restart(
        &mut self,
        ds: &Arc<dyn Dataset>,
        o: &LoaderOptions,
        state: LoaderState,
    ) -> Result<(), Failure> {
        self.stop();
        self.position = state.clone();
        self.epoch_done = false;
        let l = loader::Loader::resume_with(ds.clone(), o.clone(), state, self.targets.clone())?;
        self.monitor = l.thread_monitor();
        self.loader = Some(l);
        Ok(())
    }
}

#[allow(clippy::large_enum_variant)] // one per batch, by value: boxing would cost more than it saves
enum Step {
    Batch(loader::Batch),
    Pending,
    Stop,
}

/// Batches of fixed-size samples from a dataset, decoded by background threads.
///
/// ``source``: anything ``l3 stream`` opens — a folder of images (PNG, JPEG, PPM, L3, WebP, TIFF, BMP, GIF; labels from
/// sub-folder names), a Liquid dataset, or a PCR dataset (``group`` picks the scan group). Iterating
/// yields :class:`Batch` objects. With ``epochs=None`` (the default) each ``for`` loop over the loader
/// runs one epoch, like ``torch.utils.data.DataLoader``, and the next loop the next epoch; with
/// ``epochs=E`` one loop runs every epoch up to ``E``. ``len(loader)`` is the batches per epoch for this
/// rank. Batches are a pure function of the options, the dataset and (epoch, batch), so
/// ``state_dict()`` / ``load_state_dict()`` resume exactly, mid-epoch included.
///
/// The keywords are the loader's one options model, shared with ``l3 stream`` (same names with ``-`` for
/// ``_``, same defaults and values, the same words for a refused value); :func:`loader_options` lists them
/// with their defaults. ``crop=None`` delivers whole images: each sample keeps its image's size (after
/// ``resize``, ``jitter`` or ``max_size``, which shrinks an image whose longer side exceeds it), and
/// each batch is padded bottom and right to its largest height and width — images with ``fill``, masks
/// with ``ignore_index``; ``batch.sizes`` gives each sample's valid height and width.
/// ``decode="whole"`` decodes whole images instead of only what each crop covers;
/// ``shard_tail="drop"`` drops an epoch's uneven tail across ranks; ``pin_memory=True`` allocates host
/// batches page-locked so that a copy to the GPU is asynchronous (it needs a CUDA driver).
///
/// ``rank`` / ``world_size`` default to ``torch.distributed``'s when it is initialised, else to the
/// ``RANK`` / ``WORLD_SIZE`` environment variables, else 0 / 1: each rank reads its own shard, like
/// ``DistributedSampler``.
///
/// ``device="cuda"`` (or ``"cuda:N"``, or a ``torch.device``) decodes each batch of an L3 source on that
/// GPU in one l3-cuda launch, and fails with ``GpuError`` naming the reason when there is no usable GPU
/// (or the source is not L3) — it never decodes on the CPU instead. Only the patches under each crop are
/// read, copied and decoded; crop, padding, flip, layout, dtype and normalisation happen in the kernel,
/// and the batch stays in device memory (``batch.images.device == "cuda:N"``): ``torch.from_dlpack``
/// (or JAX's) takes it without a copy, its stream ordered after the decode. Its bytes equal the CPU
/// loader's batch (``images.tobytes()``), for ``channels`` 1, 3 and 4. With ``masks``, the label maps
/// are decoded on the GPU beside their images (``batch.masks.device == "cuda:N"``, equal to the CPU's
/// masks): they must then be one-channel L3 files (``l3 convert --to l3`` of the mask folder), and any
/// other mask is refused when the loader opens, naming it.
#[pyclass(frozen, module = "l3toolkit")]
pub struct Loader {
    dataset: Arc<dyn Dataset>,
    options: LoaderOptions,
    recorded: Recorded,
    /// Each `for` loop is one epoch (`epochs=None`).
    epoch_per_iter: bool,
    batches_per_epoch: usize,
    source: PathBuf,
    run: Mutex<Run>,
}

/// rank / world size: the arguments, else `torch.distributed`, the environment, 0 / 1.
fn rank_world(
    py: Python<'_>,
    rank: Option<usize>,
    world_size: Option<usize>,
) -> PyResult<(usize, usize)> {
    if let (Some(r), Some(w)) = (rank, world_size) {
        return Ok((r, w));
    }
    let (r, w): (usize, usize) = py
        .import("l3toolkit._distributed")?
        .call_method0("rank_and_world_size")?
        .extract()?;
    Ok((rank.unwrap_or(r), world_size.unwrap_or(w)))
}

fn int_item<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(
    py: Python<'py>,
    d: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<T> {
    let v = d.get_item(key)?.ok_or_else(|| {
        raise(
            py,
            Kind::Options,
            format!("state_dict has no {key:?}: not a state from Loader.state_dict()"),
        )
    })?;
    v.extract().map_err(|_| {
        raise(
            py,
            Kind::Options,
            format!(
                "cannot resume: state_dict[{key:?}] = {}: expected a non-negative int",
                quoted_repr(&v)
            ),
        )
    })
}

/// `v`'s `repr()` as an error message quotes it: bounded, however large the value.
fn quoted_repr(v: &Bound<'_, PyAny>) -> String {
    let repr = v.repr().map_or_else(|_| "?".into(), |r| r.to_string());
    stdx::Quoted(&repr).to_string()
}

/// The position fields of a `state_dict()`, read by the loader's one state reader.
const POSITION: [&str; 9] = [
    "epoch",
    "batch",
    "seed",
    "rank",
    "world_size",
    "batch_size",
    "dataset_len",
    "remaining",
    "fingerprint",
];

/// The position of `state` (a `state_dict()` of layout `version`) as the loader's [`LoaderState`]:
/// its fields as JSON through the one reader every state goes through, so that each is checked the one
/// way and a missing or mistyped one is refused by name.
fn position(py: Python<'_>, state: &Bound<'_, PyDict>, version: u32) -> PyResult<LoaderState> {
    let dumps = py.import("json")?.getattr("dumps")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    // Integers of other types (NumPy's) as the ints they stand for; anything else is refused below.
    kwargs.set_item("default", py.import("operator")?.getattr("index")?)?;
    let mut fields = vec![format!("\"version\":{version}")];
    for key in POSITION {
        let Some(v) = state.get_item(key)? else {
            continue;
        };
        let json: String = dumps
            .call((&v,), Some(&kwargs))
            .ok()
            .and_then(|j| j.extract::<String>().ok())
            .ok_or_else(|| {
                raise(
                    py,
                    Kind::Options,
                    format!(
                        "cannot resume: {key}: {} is not a number or text",
                        quoted_repr(&v)
                    ),
                )
            })?;
        fields.push(format!("\"{key}\":{json}"));
    }
    LoaderState::from_json_fields(&format!("{{{}}}", fields.join(",")))
        .map_err(|e| Failure::from(e).into_pyerr(py))
}

impl Loader {
    /// The options `state` recorded against this loader's, naming the first that differs. The targets'
    /// files are compared by what their paths name ([`loader::check_contents`]).
    fn check_recorded(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let saved = state.get_item("options")?.ok_or_else(|| {
            raise(
                py,
                Kind::Options,
                "cannot resume: state_dict has no \"options\"",
            )
        })?;
        let ours = self.recorded.to_dict(py)?;
        for (key, want) in ours.iter() {
            // States saved before targets, channels and max_size existed had none, 3 and none.
            let got = saved.get_item(&key).ok().or_else(|| {
                match key.extract::<String>().ok()?.as_str() {
                    "targets" => Some(pyo3::types::PyString::new(py, "").into_any()),
                    "channels" => Some(3u8.into_pyobject(py).ok()?.into_any()),
                    "max_size" => Some(py.None().into_bound(py)),
                    _ => None,
                }
            });
            if key.extract::<String>().ok().as_deref() == Some("targets")
                && let Some(g) = got.as_ref().and_then(|g| g.extract::<String>().ok())
            {
                loader::check_contents(&g, &want.extract::<String>()?)
                    .map_err(|e| Failure::from(e).into_pyerr(py))?;
                continue;
            }
            let same = match &got {
                Some(g) => g.eq(&want)?,
                None => false,
            };
            if !same {
                return Err(raise(
                    py,
                    Kind::Options,
                    format!(
                        "cannot resume: the state has {key} = {}, this loader has {want}",
                        got.map_or("nothing".into(), |g| quoted_repr(&g))
                    ),
                ));
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One wait for the next batch, with the GIL released (the lock is taken without the GIL, so a
    /// thread blocked on it never holds up the interpreter).
    fn step(&self, py: Python<'_>) -> PyResult<Step> {
        detached(py, || {
            let mut run = self.lock();
            if run.epoch_done {
                return Ok(Step::Stop);
            }
            if run.loader.is_none() {
                let at = run.position.clone();
                run.restart(&self.dataset, &self.options, at)?;
            }
            let l = run.loader.as_mut().expect("started above");
            let epoch = l.state().epoch;
            match l.next_timeout(SLICE) {
                // The epoch's last batch had every item skipped (never delivered): its end is here.
                Next::Pending if self.epoch_per_iter && l.state().epoch > epoch => {
                    run.epoch_done = true;
                    Ok(Step::Stop)
                }
                Next::Pending => Ok(Step::Pending),
                Next::End => Ok(Step::Stop),
                Next::Batch(Ok(b)) => {
                    // The loader's position moves to the next epoch after the last batch of this
                    // one: after a resume at another shape, the rest of the saved epoch, whose
                    // batches are not `batches_per_epoch`.
                    if self.epoch_per_iter && l.state().epoch != b.epoch {
                        run.epoch_done = true;
                    }
                    Ok(Step::Batch(b))
                }
                Next::Batch(Err(e)) => {
                    // The pipeline stopped; the next request restarts at the failed batch.
                    run.stop();
                    Err(e.into())
                }
            }
        })
    }

    /// Stops the pipeline threads (joined without the GIL), keeping the position.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        detached(py, || {
            self.lock().stop();
            Ok(())
        })
    }
}

impl Drop for Loader {
    /// Stops and joins the pipeline threads with the GIL released, so that other Python threads keep
    /// running while the threads finish the items in hand (with the GIL held when the interpreter is
    /// shutting down).
    fn drop(&mut self) {
        let run = self.run.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = run.loader.take() {
            let join = move || drop(l);
            Python::try_attach(|py| py.detach(join));
        }
    }
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(
        text_signature = "(source, batch_size, *, crop=(224, 224), random_crop=False, flip=False, \
        shuffle=True, seed=0, epochs=None, drop_last=False, rank=None, world_size=None, threads=None, \
        layout=\"NCHW\", dtype=\"uint8\", mean=None, std=None, device=\"cpu\", sampler=\"uniform\", \
        budget=None, group=None, labels=None, io_threads=2, prefetch=4, skip_errors=False, \
        partial_images=False, storage_mbps=None, retry_secs=60, cache_dir=None, cache_limit=None, pcr_window=4, \
        pcr_partial=False, decode=\"region\", \
        gpu_fallback=False, pin_memory=False, shard_tail=\"pad\", scale=None, ratio=None, resize=None, \
        jitter=None, max_size=None, interpolation=\"bilinear\", fill=0, channels=3, masks=None, image_suffix=None, \
        mask_suffix=None, ignore_index=255, boxes=None, min_box_size=1)"
    )]
    #[pyo3(signature = (source, batch_size, **kwargs))]
    fn new(
        py: Python<'_>,
        source: PathBuf,
        batch_size: usize,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Loader> {
        let mut settings = crate::options::settings(py, Some(batch_size), kwargs)?;
        if settings.rank.is_none() || settings.world_size.is_none() {
            let (rank, world_size) = rank_world(py, settings.rank, settings.world_size)?;
            settings.rank = Some(rank);
            settings.world_size = Some(world_size);
        }
        let (options, open) = settings
            .resolve()
            .map_err(|e| raise(py, Kind::Options, e.to_string()))?;
        let (seed, rank, world_size, batch_size) = (
            options.seed,
            options.rank,
            options.world_size,
            options.batch_size,
        );
        let (dataset, run) = detached(py, || {
            let dataset = open_dataset(&source, &open)?;
            let position = LoaderState {
                epoch: 0,
                batch: 0,
                seed,
                rank,
                world_size,
                batch_size,
                dataset_len: dataset.len(),
                remaining: None,
                // The options are checked by `load_state_dict` against those it recorded.
                contents: None,
                // Taken from the dataset when the pipeline starts.
                fingerprint: None,
            };
            let targets =
                loader::targets::Targets::open(&*dataset, &options.targets, options.skip_errors)?
                    .map(Arc::new);
            let mut run = Run {
                loader: None,
                position: position.clone(),
                epoch_done: false,
                monitor: ThreadMonitor::default(),
                targets,
            };
            run.restart(&dataset, &options, position)?;
            Ok((dataset, run))
        })?;
        let batches_per_epoch = run.loader.as_ref().expect("started").batches_per_epoch();
        Ok(Loader {
            dataset,
            recorded: Recorded::of(&options),
            epoch_per_iter: options.epochs.is_none(),
            options,
            batches_per_epoch,
            source,
            run: Mutex::new(run),
        })
    }

    fn __iter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let py = slf.py();
        let this = slf.get();
        detached(py, || {
            this.lock().epoch_done = false;
            Ok(())
        })?;
        Ok(slf)
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        loop {
            match self.step(py)? {
                Step::Batch(b) => return Batch::new(py, b).map(Some),
                Step::Stop => return Ok(None),
                Step::Pending => {
                    if let Err(interrupt) = py.check_signals() {
                        self.stop(py)?;
                        return Err(interrupt);
                    }
                }
            }
        }
    }

    /// Batches per epoch for this rank.
    fn __len__(&self) -> usize {
        self.batches_per_epoch
    }

    /// Moves to the start of epoch ``epoch`` (what ``DistributedSampler.set_epoch`` is called for). A
    /// loader already there keeps its prefetched batches.
    fn set_epoch(&self, py: Python<'_>, epoch: usize) -> PyResult<()> {
        detached(py, || {
            let mut run = self.lock();
            let want = LoaderState {
                epoch,
                batch: 0,
                remaining: None,
                ..run.state()
            };
            if run.loader.is_some() && run.state() == want {
                run.epoch_done = false;
                return Ok(());
            }
            run.restart(&self.dataset, &self.options, want)
        })
    }

    /// The position of the next batch, and the options it is valid for: save it with a checkpoint and
    /// hand it to :meth:`load_state_dict` to continue exactly there.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = detached(py, || Ok(self.lock().state()))?;
        let d = PyDict::new(py);
        d.set_item("version", STATE_VERSION)?;
        d.set_item("epoch", s.epoch)?;
        d.set_item("batch", s.batch)?;
        d.set_item("seed", s.seed)?;
        d.set_item("rank", s.rank)?;
        d.set_item("world_size", s.world_size)?;
        d.set_item("batch_size", s.batch_size)?;
        d.set_item("dataset_len", s.dataset_len)?;
        d.set_item("remaining", s.remaining_text())?;
        d.set_item("fingerprint", s.fingerprint)?;
        d.set_item("options", self.recorded.to_dict(py)?)?;
        Ok(d)
    }

    /// Continues at a position saved by :meth:`state_dict`. Refused with ``OptionsError`` when the state
    /// belongs to other options (seed, world size, batch size, crop, ...) or another dataset (its
    /// ``fingerprint``: the names, sizes and labels of its items; a state saved before states carried one
    /// is checked by ``dataset_len`` alone, with a ``UserWarning``), or when a field is missing or
    /// mistyped, naming it. Every rank has the same batches per epoch and moves in lockstep, so a state
    /// saved by any rank (rank 0, in a checkpoint) resumes every rank at its own shard's position.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let version: u32 = int_item(py, state, "version")?;
        if version == 0 || version > STATE_VERSION {
            return Err(raise(
                py,
                Kind::Options,
                format!(
                    "cannot resume: state_dict version {version}: this l3toolkit reads versions 1 to \
                     {STATE_VERSION}"
                ),
            ));
        }
        self.check_recorded(py, state)?;
        let st = position(py, state, version)?;
        if st.fingerprint.is_none() {
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyUserWarning>(),
                c"load_state_dict: the state names no dataset (it comes from an l3toolkit before \
                  state version 3): only the dataset's length is checked",
                1,
            )?;
        }
        detached(py, || self.lock().restart(&self.dataset, &self.options, st))
    }

    /// The pipeline's counters since it (re)started, as a dict: items and bytes read, pixels decoded,
    /// busy seconds of each stage, batches and items delivered, the consumer's wait, GPU batches; and what
    /// the dataset's storage did since it opened (``storage_requests``, ``storage_bytes_read``,
    /// ``storage_retries``, ``cache_hits``, ``cache_misses``, ``cache_hit_rate``, ``cache_hit_bytes``,
    /// ``cache_dropped``: entries found corrupt or stale and fetched again).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = detached(py, || Ok(self.lock().loader.as_ref().map(|l| l.stats())))?
            .unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("elapsed_s", s.elapsed.as_secs_f64())?;
        d.set_item("io_threads", s.io_threads)?;
        d.set_item("decode_threads", s.decode_threads)?;
        d.set_item("items_read", s.items_read)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("read_busy_s", s.read_busy.as_secs_f64())?;
        d.set_item("items_decoded", s.items_decoded)?;
        d.set_item("pixels_decoded", s.pixels_decoded)?;
        d.set_item("decode_busy_s", s.decode_busy.as_secs_f64())?;
        d.set_item("assemble_busy_s", s.assemble_busy.as_secs_f64())?;
        d.set_item("items_skipped", s.items_skipped)?;
        d.set_item("items_partial", s.items_partial)?;
        d.set_item("batches_delivered", s.batches_delivered)?;
        d.set_item("items_delivered", s.items_delivered)?;
        d.set_item("consumer_wait_s", s.consumer_wait.as_secs_f64())?;
        d.set_item("gpu_batches", s.gpu_batches)?;
        d.set_item("gpu_fallback_batches", s.gpu_fallback_batches)?;
        d.set_item("images_per_sec", s.images_per_sec())?;
        if let Some(st) = self.dataset.storage() {
            let c = st.stats();
            d.set_item("storage_requests", c.requests)?;
            d.set_item("storage_bytes_read", c.bytes_read)?;
            d.set_item("storage_retries", c.retries)?;
            d.set_item("cache_hits", c.cache_hits)?;
            d.set_item("cache_misses", c.cache_misses)?;
            d.set_item("cache_hit_rate", c.cache_hit_rate())?;
            d.set_item("cache_hit_bytes", c.cache_hit_bytes)?;
            d.set_item("cache_dropped", c.cache_dropped)?;
        }
        Ok(d)
    }

    /// Stops and joins every pipeline thread now (dropping the loader does too). Iterating again
    /// restarts where it stopped.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.stop(py)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }

    /// Items in the dataset (all ranks).
    #[getter]
    fn dataset_len(&self) -> usize {
        self.dataset.len()
    }

    /// Samples per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.options.batch_size
    }

    /// This process's rank: which shard of every epoch it reads.
    #[getter]
    fn rank(&self) -> usize {
        self.options.rank
    }

    /// Ranks the epochs are sharded across.
    #[getter]
    fn world_size(&self) -> usize {
        self.options.world_size
    }

    /// The epoch of the next batch.
    #[getter]
    fn epoch(&self, py: Python<'_>) -> PyResult<usize> {
        detached(py, || Ok(self.lock().state().epoch))
    }

    /// Threads of the pipeline still running (0 once it is stopped and joined).
    #[getter]
    fn threads_alive(&self, py: Python<'_>) -> PyResult<usize> {
        detached(py, || Ok(self.lock().monitor.alive()))
    }

    /// Where dataset item ``index`` lives (its file, or a file and a position in it): what errors name.
    fn item_source(&self, index: usize) -> PyResult<String> {
        if index >= self.dataset.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "item {index} of a dataset of {}",
                self.dataset.len()
            )));
        }
        Ok(self.dataset.source(index).display().to_string())
    }

    /// What opening the dataset left out (special files, folders reached twice), one line each.
    #[getter]
    fn warnings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.dataset.warnings())
    }

    fn __repr__(&self) -> String {
        format!(
            "Loader({:?}: {}, batch_size={}, rank={} of {}, {} batches per epoch)",
            self.source.display().to_string(),
            self.dataset.describe(),
            self.options.batch_size,
            self.options.rank,
            self.options.world_size,
            self.batches_per_epoch
        )
    }
}

/// How far the order a ``Loader`` with these options would follow is from a uniform shuffle, computed
/// from its schedule alone (no image is read): ``{"items", "epochs", "batch_size", "world_size",
/// "window", "stats": {name: {"order", "uniform", "meaning"}}}`` over ``epochs`` epochs of every rank.
/// The statistics: ``order_correlation``, ``position_spread``, ``neighbours_same_batch``,
/// ``batch_span`` and ``label_entropy_bits`` (see ``meaning``). Seeded orders only (uniform, PCR).
#[pyfunction]
#[pyo3(signature = (source, batch_size, epochs = 8, **kwargs))]
pub fn shuffle_report<'py>(
    py: Python<'py>,
    source: PathBuf,
    batch_size: usize,
    epochs: usize,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut settings = crate::options::settings(py, Some(batch_size), kwargs)?;
    settings.rank.get_or_insert(0);
    settings.world_size.get_or_insert(1);
    let (options, open) = settings
        .resolve()
        .map_err(|e| raise(py, Kind::Options, e.to_string()))?;
    let r = detached(py, || {
        let ds = open_dataset(&source, &open)?;
        Ok(loader::shuffle_report(&*ds, &options, epochs)?)
    })?;
    let d = PyDict::new(py);
    d.set_item("items", r.items)?;
    d.set_item("epochs", r.epochs)?;
    d.set_item("batch_size", r.batch_size)?;
    d.set_item("world_size", r.world_size)?;
    d.set_item("window", r.window)?;
    let stats = PyDict::new(py);
    for s in &r.stats {
        let one = PyDict::new(py);
        one.set_item("order", s.order)?;
        one.set_item("uniform", s.uniform)?;
        one.set_item("meaning", s.meaning)?;
        stats.set_item(s.name, one)?;
    }
    d.set_item("stats", stats)?;
    Ok(d)
}
