//! A JPEG written as its rows come ([`JpegRows`]), for outputs too large to hold whole: the encoder
//! (`jpeg-encoder`, baseline, 4:2:0) runs on its own thread and pulls the rows, a band at a time, from
//! a bounded channel; what is held is the bands in flight and one row of 16-pixel blocks.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

/// Bands waiting for the encoder at most: the producer blocks beyond, so memory stays bounded.
const QUEUED_BANDS: usize = 2;

/// A JPEG of `width × height` 8-bit pixels, 1 (gray) or 3 (RGB) channels, encoded row by row into `W`.
pub struct JpegRows<W: Write + Send + 'static> {
    tx: Option<SyncSender<Vec<u8>>>,
    worker: Option<std::thread::JoinHandle<Result<W, String>>>,
    aborted: Arc<AtomicBool>,
    row_bytes: usize,
    rows_left: usize,
}

impl<W: Write + Send + 'static> JpegRows<W> {
    /// Starts the encoder at `quality` (1 to 100). JPEG sides are 16-bit: a side over 65,535 pixels, an
    /// empty image or another channel count is refused here, before a row is computed.
    pub fn new(
        out: W,
        width: usize,
        height: usize,
        channels: usize,
        quality: u8,
    ) -> Result<JpegRows<W>, String> {
        let (Ok(w16), Ok(h16)) = (u16::try_from(width), u16::try_from(height)) else {
            return Err(format!(
                "a JPEG holds at most 65,535 pixels a side; the image is {width}x{height}"
            ));
        };
        if width == 0 || height == 0 {
            return Err(format!("an empty image ({width}x{height})"));
        }
        if channels != 1 && channels != 3 {
            return Err(format!(
                "a JPEG holds 1 or 3 channels, the image has {channels}"
            ));
        }
        let (tx, rx) = sync_channel(QUEUED_BANDS);
        let aborted = Arc::new(AtomicBool::new(false));
        let abort = aborted.clone();
        let source = Streamed {
            rx: Mutex::new(Band {
                rx,
                px: Vec::new(),
                first: 0,
                rows: 0,
            }),
            w: w16,
            h: h16,
            channels,
        };
        let worker = std::thread::Builder::new()
            .name("jpeg-rows".into())
            .spawn(move || {
                let mut writer = Abortable {
                    inner: out,
                    aborted: abort,
                };
                jpeg_encoder::Encoder::new(&mut writer, quality.clamp(1, 100))
                    .encode_image(source)
                    .map_err(|e| e.to_string())?;
                writer.inner.flush().map_err(|e| e.to_string())?;
                Ok(writer.inner)
            })
            .map_err(|e| format!("starting the JPEG encoder: {e}"))?;
        Ok(JpegRows {
            tx: Some(tx),
            worker: Some(worker),
            aborted,
            row_bytes: width * channels,
            rows_left: height,
        })
    }

    /// Hands over whole rows, interleaved (`width × channels` bytes each), in order.
    pub fn rows(&mut self, px: &[u8]) -> Result<(), String> {
        if !px.len().is_multiple_of(self.row_bytes) || px.len() / self.row_bytes > self.rows_left {
            return Err(format!(
                "internal: {} bytes are not whole rows of the {} left",
                px.len(),
                self.rows_left
            ));
        }
        self.rows_left -= px.len() / self.row_bytes;
        let tx = self.tx.as_ref().expect("rows after finish");
        if tx.send(px.to_vec()).is_err() {
            // The encoder stopped: its error is what `finish` reports.
            return Err(self.stop());
        }
        Ok(())
    }

    /// Waits for the encoder to write the last rows and returns the output, flushed; every row must
    /// have been given.
    pub fn finish(mut self) -> Result<W, String> {
        if self.rows_left != 0 {
            return Err(format!(
                "internal: {} rows were never given",
                self.rows_left
            ));
        }
        self.tx = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err("the JPEG encoder thread panicked".into()),
            None => Err("internal: the JPEG encoder was already stopped".into()),
        }
    }

    /// Stops the encoder (its next write fails) and returns its error.
    fn stop(&mut self) -> String {
        self.aborted.store(true, Ordering::Relaxed);
        self.tx = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => e,
            _ => "the JPEG encoder stopped".into(),
        }
    }
}

impl<W: Write + Send + 'static> Drop for JpegRows<W> {
    /// Dropped unfinished (the run failed): the encoder stops at its next write instead of encoding
    /// the rest of the image from rows that will never come.
    fn drop(&mut self) {
        if self.worker.is_some() {
            self.stop();
        }
    }
}

/// The output, failing every write once the producer gave up.
struct Abortable<W> {
    inner: W,
    aborted: Arc<AtomicBool>,
}

impl<W: Write> Write for Abortable<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.aborted.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("the run producing the rows failed"));
        }
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct Band {
    rx: Receiver<Vec<u8>>,
    px: Vec<u8>,
    /// The band's first row, and its rows.
    first: usize,
    rows: usize,
}

/// The rows as the encoder asks for them, in order (its last block row repeats the image's last row).
struct Streamed {
    rx: Mutex<Band>,
    w: u16,
    h: u16,
    channels: usize,
}

impl jpeg_encoder::ImageBuffer for Streamed {
    fn get_jpeg_color_type(&self) -> jpeg_encoder::JpegColorType {
        if self.channels == 1 {
            jpeg_encoder::JpegColorType::Luma
        } else {
            jpeg_encoder::JpegColorType::Ycbcr
        }
    }

    fn width(&self) -> u16 {
        self.w
    }

    fn height(&self) -> u16 {
        self.h
    }

    fn fill_buffers(&self, y: u16, buffers: &mut [Vec<u8>; 4]) {
        let y = usize::from(y);
        let row = usize::from(self.w) * self.channels;
        let mut b = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        while y >= b.first + b.rows {
            match b.rx.recv() {
                Ok(px) => {
                    b.first += b.rows;
                    b.rows = px.len() / row;
                    b.px = px;
                }
                // The producer is gone (the run failed): zeros, and the output fails at its next write.
                Err(_) => {
                    for (c, buf) in buffers.iter_mut().enumerate().take(self.channels) {
                        buf.extend(std::iter::repeat_n(
                            if c == 0 { 0 } else { 128 },
                            row / self.channels,
                        ));
                    }
                    return;
                }
            }
        }
        let line = &b.px[(y - b.first) * row..][..row];
        if self.channels == 1 {
            buffers[0].extend_from_slice(line);
        } else {
            for p in line.chunks_exact(3) {
                let (l, cb, cr) = jpeg_encoder::rgb_to_ycbcr(p[0], p[1], p[2]);
                buffers[0].push(l);
                buffers[1].push(cb);
                buffers[2].push(cr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> image::DynamicImage {
        image::load_from_memory_with_format(bytes, image::ImageFormat::Jpeg).unwrap()
    }

    /// Rows given in bands of several heights decode to the image (JPEG's loss only), and to what the
    /// whole-image encoder's file decodes to, within rounding: odd sizes (partial blocks both ways), RGB
    /// and gray.
    #[test]
    fn rows_in_bands_decode_to_the_image_and_to_the_whole_encode() {
        for (w, h, c, band) in [
            (53usize, 37usize, 3usize, 5usize),
            (7, 3, 3, 1),
            (1, 1, 1, 1),
            (40, 33, 1, 16),
        ] {
            let px: Vec<u8> = (0..w * h * c)
                .map(|i| ((i / c % w) * 4 + (i / c / w) * 3 + (i % c) * 40) as u8)
                .collect();
            let mut enc = JpegRows::new(Vec::new(), w, h, c, 95).unwrap();
            for rows in px.chunks(band * w * c) {
                enc.rows(rows).unwrap();
            }
            let bytes = enc.finish().unwrap();
            let got = decode(&bytes);
            assert_eq!((got.width() as usize, got.height() as usize), (w, h));
            let got = if c == 3 {
                got.to_rgb8().into_raw()
            } else {
                got.to_luma8().into_raw()
            };
            let img = crate::Image {
                width: w as u32,
                height: h as u32,
                channels: c as u8,
                pixels: px.clone(),
            };
            let whole =
                decode(&super::super::encode(&img, super::super::Target::Jpeg(95)).unwrap());
            let whole = if c == 3 {
                whole.to_rgb8().into_raw()
            } else {
                whole.to_luma8().into_raw()
            };
            let worst = |a: &[u8], b: &[u8]| {
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| x.abs_diff(y))
                    .max()
                    .unwrap_or(0)
            };
            let mean = got
                .iter()
                .zip(&px)
                .map(|(&x, &y)| f64::from(x.abs_diff(y)))
                .sum::<f64>()
                / px.len() as f64;
            assert!(
                mean < 3.0,
                "{w}x{h}x{c}: mean error {mean} against the image"
            );
            assert!(
                worst(&got, &whole) <= 2,
                "{w}x{h}x{c}: {} from the whole encode",
                worst(&got, &whole)
            );
        }
    }

    #[test]
    fn sizes_a_jpeg_cannot_hold_are_refused_before_any_row() {
        for (w, h, c, says) in [
            (70_000, 10, 3, "65,535"),
            (10, 0, 3, "empty"),
            (10, 10, 2, "1 or 3 channels"),
        ] {
            let e = JpegRows::new(Vec::new(), w, h, c, 90).err().unwrap();
            assert!(e.contains(says), "{w}x{h}x{c}: {e}");
        }
    }

    /// An output that fails is the error of `rows` or `finish`; a writer dropped unfinished stops its
    /// encoder instead of waiting for rows that never come.
    #[test]
    fn a_failing_output_is_an_error_and_an_unfinished_one_stops() {
        struct Full(usize);
        impl Write for Full {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if self.0 < buf.len() {
                    return Err(std::io::Error::other("disk full"));
                }
                self.0 -= buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (w, h) = (256, 256);
        let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 7919 % 251) as u8).collect();
        let mut enc = JpegRows::new(Full(1000), w, h, 3, 95).unwrap();
        let mut failed = None;
        for rows in px.chunks(16 * w * 3) {
            if let Err(e) = enc.rows(rows) {
                failed = Some(e);
                break;
            }
        }
        let e = match failed {
            Some(e) => e,
            None => enc.finish().err().unwrap(),
        };
        assert!(e.contains("disk full"), "{e}");

        let mut enc = JpegRows::new(Vec::new(), w, h, 3, 95).unwrap();
        enc.rows(&px[..32 * w * 3]).unwrap();
        drop(enc);
    }
}
