//! Decoding rebuilt JPEG streams to RGB, with a choice of decoder.
//!
//! The two differ exactly where PCRs live: with AC data still missing (low scan groups) libjpeg-turbo
//! smooths blocks from their neighbours' DC values, zune-jpeg does not; with every scan present both give
//! the original's pixels (each bit-exactly against itself decoding the source file).

use crate::error::JpegError;
use crate::libjpeg;
pub use vocab::Image;
use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

/// Which JPEG decoder turns a rebuilt stream into pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decoder {
    /// libjpeg-turbo (mozjpeg build) with its defaults: accurate integer IDCT, fancy upsampling, block
    /// smoothing for incomplete progressive data. Any libjpeg warning is an error.
    #[default]
    Libjpeg,
    /// zune-jpeg, pure Rust; no smoothing of missing AC data.
    Zune,
}

impl Decoder {
    pub const ALL: [Decoder; 2] = [Decoder::Libjpeg, Decoder::Zune];

    pub fn name(self) -> &'static str {
        match self {
            Decoder::Libjpeg => "libjpeg-turbo",
            Decoder::Zune => "zune-jpeg",
        }
    }

    /// Decodes one JPEG stream to 8-bit RGB (grayscale is replicated to three channels).
    pub fn decode(self, jpeg: &[u8]) -> Result<Image, JpegError> {
        match self {
            Decoder::Libjpeg => {
                libjpeg::decode_rgb(jpeg).map(|r| Image::rgb8(r.width, r.height, r.pixels))
            }
            Decoder::Zune => decode_zune(jpeg),
        }
    }
}

impl std::str::FromStr for Decoder {
    type Err = vocab::Invalid;
    fn from_str(s: &str) -> Result<Self, vocab::Invalid> {
        match s {
            "libjpeg" | "libjpeg-turbo" => Ok(Decoder::Libjpeg),
            "zune" | "zune-jpeg" => Ok(Decoder::Zune),
            _ => Err(vocab::Invalid::new("decoder", s, "libjpeg or zune")),
        }
    }
}

fn decode_zune(jpeg: &[u8]) -> Result<Image, JpegError> {
    let opts = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(1 << 16)
        .set_max_height(1 << 16);
    let mut d = JpegDecoder::new_with_options(ZCursor::new(jpeg), opts);
    d.decode_headers().map_err(zune_message)?;
    let info = d
        .info()
        .ok_or_else(|| JpegError::Zune("no image header".into()))?;
    let (w, h) = (u32::from(info.width), u32::from(info.height));
    if u64::from(w) * u64::from(h) > libjpeg::MAX_PIXELS {
        return Err(JpegError::TooLarge {
            width: w,
            height: h,
            max: libjpeg::MAX_PIXELS,
        });
    }
    let out = d
        .output_colorspace()
        .ok_or_else(|| JpegError::Zune("no output colour space".into()))?;
    let pixels = d.decode().map_err(zune_message)?;
    let n = (w * h) as usize;
    let pixels = match out.num_components() {
        3 if pixels.len() == n * 3 => pixels,
        1 if pixels.len() == n => pixels.iter().flat_map(|&v| [v, v, v]).collect(),
        c => {
            return Err(JpegError::Zune(format!(
                "unexpected output: {c} components, {} bytes",
                pixels.len()
            )));
        }
    };
    Ok(Image::rgb8(w, h, pixels))
}

/// zune-jpeg's `Display` prints its `Debug` form, which quotes free text (`Format("...")`); this keeps the
/// words and drops the quoting.
fn zune_message(e: zune_jpeg::errors::DecodeErrors) -> JpegError {
    use zune_jpeg::errors::DecodeErrors as E;
    JpegError::Zune(match e {
        E::Format(s) => s,
        E::FormatStatic(s) => s.to_string(),
        E::ExhaustedData | E::IoErrors(_) => "the data ends too early".into(),
        // The other variants' `Debug` text is a plain sentence.
        other => format!("{other:?}").trim().replace('\n', " "),
    })
}
