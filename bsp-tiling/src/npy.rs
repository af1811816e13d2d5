//! NumPy `.npy` files of little-endian float32 in C order: the raw network output (`C×H×W`), and test
//! inputs. [`NpyWriter`] writes the header first and the data in any order at its offsets, so an output is
//! written tile by tile without holding it.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::fs::File;
use std::io::Seek;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::OnnxFormat {
        model: path.display().to_string(),
        reason: format!("not a float32 .npy: {}", reason.into()),
    }
}

/// The `.npy` header (version 1.0, padded to a multiple of 64 bytes) for a float32 array of `shape`.
pub fn header(shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    let len = (dict.len() + 1 + 10).div_ceil(64) * 64 - 10;
    h.extend_from_slice(&(len as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(10 + len - 1, b' ');
    h.push(b'\n');
    h
}

/// Reads a float32 C-order `.npy` of rank 3 (`C×H×W`) or 4 with N = 1.
pub fn read(path: &Path) -> Result<Tensor> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let mut head = [0u8; 10];
    f.read_exact(&mut head).map_err(io)?;
    if &head[..6] != b"\x93NUMPY" {
        return Err(bad(path, "no NUMPY magic"));
    }
    let hlen = if head[6] == 1 {
        u16::from_le_bytes([head[8], head[9]]) as usize
    } else {
        let mut more = [0u8; 2];
        f.read_exact(&mut more).map_err(io)?;
        u32::from_le_bytes([head[8], head[9], more[0], more[1]]) as usize
    };
    let mut dict = vec![0u8; hlen];
    f.read_exact(&mut dict).map_err(io)?;
    let dict = String::from_utf8_lossy(&dict);
    if !dict.contains("'<f4'") || dict.contains("'fortran_order': True") {
        return Err(bad(
            path,
            format!("header {dict}: expected '<f4' in C order"),
        ));
    }
    let shape_txt = dict
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad(path, "no shape"))?;
    let shape: Vec<usize> = shape_txt
        .trim()
        .trim_start_matches('(')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| bad(path, format!("shape {shape_txt}")))
        })
        .collect::<Result<_>>()?;
    let (c, h, w) = match shape[..] {
        [c, h, w] | [1, c, h, w] => (c, h, w),
        _ => {
            return Err(bad(
                path,
                format!("shape {shape:?}: expected C×H×W or 1×C×H×W"),
            ));
        }
    };
    // The length is checked before anything is allocated, so a header with an absurd shape is an error,
    // not an allocation failure; the values are read in chunks straight into the tensor.
    let start = f.stream_position().map_err(io)?;
    let len = f.metadata().map_err(io)?.len().saturating_sub(start);
    let want = (c as u64)
        .checked_mul(h as u64)
        .and_then(|n| n.checked_mul(w as u64))
        .and_then(|n| n.checked_mul(4));
    if want != Some(len) {
        return Err(bad(path, format!("{len} data bytes for shape {shape:?}")));
    }
    let mut data = Vec::with_capacity(c * h * w);
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = len as usize;
    while left > 0 {
        let part = &mut chunk[..left.min(1 << 20)];
        f.read_exact(part).map_err(io)?;
        data.extend(
            part.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        left -= part.len();
    }
    Tensor::from_vec(c, h, w, data)
}

/// Writes a tensor as a `C×H×W` float32 `.npy`.
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::create(path).map_err(io)?;
    f.write_all(&header(&[t.c, t.h, t.w])).map_err(io)?;
    f.write_all(bytemuck::cast_slice(&t.data)).map_err(io)?;
    Ok(())
}

/// A `C×H×W` float32 `.npy` written region by region (positioned writes: regions in any order, from any
/// thread).
pub struct NpyWriter {
    path: std::path::PathBuf,
    file: File,
    shape: (usize, usize, usize),
    offset: u64,
}

impl NpyWriter {
    /// Creates `path` with its header, sized for the whole array (a sparse file until written).
    pub fn create(path: &Path, c: usize, h: usize, w: usize) -> std::io::Result<NpyWriter> {
        NpyWriter::from_file(File::create(path)?, path, c, h, w)
    }

    /// As [`create`](Self::create), into `file` (empty, opened for writing; `path` names it in errors):
    /// e.g. the temporary of a `stdx::fs::AtomicFile`.
    pub fn from_file(
        mut file: File,
        path: &Path,
        c: usize,
        h: usize,
        w: usize,
    ) -> std::io::Result<NpyWriter> {
        let head = header(&[c, h, w]);
        file.write_all(&head)?;
        file.set_len(head.len() as u64 + (c * h * w * 4) as u64)?;
        Ok(NpyWriter {
            path: path.to_path_buf(),
            file,
            shape: (c, h, w),
            offset: head.len() as u64,
        })
    }

    /// Writes `t` with its top-left corner at `(y0, x0)`, clipped to the array.
    pub fn put(&self, y0: usize, x0: usize, t: &Tensor) -> std::io::Result<()> {
        let (c, h, w) = self.shape;
        let rows = t.h.min(h.saturating_sub(y0));
        let cols = t.w.min(w.saturating_sub(x0));
        for ch in 0..c.min(t.c) {
            for y in 0..rows {
                let src = &t.data[(ch * t.h + y) * t.w..][..cols];
                let at = self.offset + (((ch * h + y0 + y) * w + x0) * 4) as u64;
                self.file.write_all_at(bytemuck::cast_slice(src), at)?;
            }
        }
        Ok(())
    }

    pub fn finish(self) -> std::io::Result<()> {
        self.file.sync_all()
    }
}

impl crate::field::Sink for NpyWriter {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> Result<()> {
        self.put(y0, x0, t).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_bytes(shape: &str, values: usize) -> Vec<u8> {
        let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape}), }}");
        while (10 + dict.len() + 1) % 64 != 0 {
            dict.push(' ');
        }
        dict.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((dict.len() as u16).to_le_bytes());
        b.extend(dict.as_bytes());
        b.extend((0..values).flat_map(|i| (i as f32 * 0.5).to_le_bytes()));
        b
    }

    #[test]
    fn reads_what_it_writes_and_names_the_file_of_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        // More than one read chunk.
        let t =
            Tensor::from_vec(3, 300, 500, (0..450_000).map(|i| i as f32 - 7.25).collect()).unwrap();
        write(&p, &t).unwrap();
        let back = read(&p).unwrap();
        assert_eq!((back.c, back.h, back.w), (3, 300, 500));
        assert_eq!(back.data, t.data);

        for (name, bytes, says) in [
            ("short.npy", npy_bytes("2, 3, 4", 23), "92 data bytes"),
            ("long.npy", npy_bytes("2, 3, 4", 25), "100 data bytes"),
            // 4·10¹⁵ bytes: refused before anything is allocated.
            (
                "absurd.npy",
                npy_bytes("100000, 100000, 100000", 4),
                "16 data bytes",
            ),
            ("magic.npy", b"NUMPY\x93\x01\x00".to_vec(), "magic"),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            let e = read(&p).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(says), "{name}: {e}");
        }
    }
}
