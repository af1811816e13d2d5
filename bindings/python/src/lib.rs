//! `l3toolkit._l3toolkit`: the native half of the `l3toolkit` Python package (the pure-Python half, in
//! `py_src/l3toolkit/`, re-exports it with the exception classes, the rank defaults and type stubs).
//!
//! - [`codec`]: `encode`, `decode`, `decode_region`, `info`, `read_image` on NumPy arrays.
//! - [`buffers`]: `decode_batch`, a list of L3 buffers from any pipeline into one DLPack tensor.
//! - [`loading`]: `Loader` (the loader's pipeline as an iterator) and `Batch`.
//! - [`tensor`]: `Tensor` and `Masks`, the batch's images and label maps exported through DLPack without
//!   a copy.
//! - [`convert`]: `convert`, dataset folders into L3, raw, PNG, JPEG, PCR or Liquid.
//! - [`infer`]: `infer` and `Model` (any supported network, on arrays and paths); [`infer_options`]:
//!   their keywords into `infer_io::InferSettings`, the options model `l3 infer` and `l3 stylize` share.
//! - [`stylize`]: `stylize`, bsp-tiling's tiled style transfer (`StyleModel`, `Model`'s deprecated
//!   name, is defined in Python).
//! - [`errors`]: the exception mapping, and [`errors::detached`], which every call into Rust work goes
//!   through (GIL released, panics caught).
//!
//! `unsafe` lives only in `tensor.rs` (completing a DLPack managed tensor).
#![deny(unsafe_code)]

mod buffers;
mod codec;
mod convert;
mod errors;
mod infer;
mod infer_options;
mod loading;
mod options;
mod stylize;
#[allow(unsafe_code)]
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _l3toolkit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(codec::encode, m)?)?;
    m.add_function(wrap_pyfunction!(codec::decode, m)?)?;
    m.add_function(wrap_pyfunction!(codec::decode_region, m)?)?;
    m.add_function(wrap_pyfunction!(codec::info, m)?)?;
    m.add_function(wrap_pyfunction!(codec::read_image, m)?)?;
    m.add_function(wrap_pyfunction!(codec::read_header, m)?)?;
    m.add_function(wrap_pyfunction!(buffers::decode_batch, m)?)?;
    m.add_function(wrap_pyfunction!(convert::convert, m)?)?;
    m.add_function(wrap_pyfunction!(stylize::stylize, m)?)?;
    m.add_function(wrap_pyfunction!(infer::infer, m)?)?;
    m.add_function(wrap_pyfunction!(options::loader_options, m)?)?;
    m.add_function(wrap_pyfunction!(infer_options::infer_options, m)?)?;
    m.add_function(wrap_pyfunction!(loading::shuffle_report, m)?)?;
    m.add_class::<loading::Loader>()?;
    m.add_class::<loading::Batch>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<tensor::Masks>()?;
    m.add_class::<infer::Model>()?;
    Ok(())
}
