//! libjpeg-turbo (the mozjpeg fork, built from source by `mozjpeg-sys`): the crate's only `unsafe` code.
//!
//! The toolkit's one libjpeg binding (the loader decodes its JPEGs through it too). Its entry points are
//! safe functions and types over byte slices:
//! - [`transcode_progressive`]: `jpegtran -progressive -copy none` in the coefficient domain
//!   (read the DCT coefficients, copy the critical parameters, simple progression, write the coefficients);
//! - [`Reader`]: read a stream's header (size, colour, EXIF) so the caller can check the size against its
//!   limits before anything is allocated, then decode it to 8-bit gray or RGB, returning libjpeg's warnings
//!   for the caller to judge ([`Warning::is_corrupt_data`]);
//! - [`decode_rgb`]: decode a stream to 8-bit RGB, any warning an error.
//!
//! Soundness of the error path: libjpeg's default `error_exit` calls `exit()`. We install an `error_exit`
//! that unwinds with a private payload instead (`resume_unwind`, so no panic hook prints anything), and
//! every libjpeg call runs inside `catch_unwind`. This is sound because `mozjpeg-sys` (with its default
//! `unwinding` feature) declares every libjpeg function and callback `extern "C-unwind"` and compiles the
//! C code with `-fexceptions`, so the unwind tables exist for the C frames it crosses; no C frame holds
//! resources that need cleanup other than what `jpeg_destroy_*` frees, which our guards call on drop
//! (the same thing libjpeg's setjmp/longjmp pattern does). Warnings (`emit_message` with level -1) are
//! counted and kept, with their message code, instead of printed: the code tells corrupt data (a premature
//! end, a bad Huffman code: libjpeg fills in zeros and carries on) from harmless remarks.

use crate::error::JpegError;
use mozjpeg_sys as sys;
use std::ffi::{c_int, c_ulong};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

/// The largest image the decoder will allocate for (pixels), so a hostile header cannot exhaust memory.
pub const MAX_PIXELS: u64 = 1 << 28;

/// The payload our `error_exit` unwinds with.
struct LibjpegError(String);

/// A libjpeg warning: its message code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub code: c_int,
    pub text: String,
}

impl Warning {
    /// Whether the warning means the entropy-coded data is damaged or missing, so libjpeg substituted
    /// zeros (or skipped bytes) and the coefficients are not the ones the file was meant to hold.
    pub fn is_corrupt_data(&self) -> bool {
        matches!(
            self.code,
            sys::JWRN_BOGUS_PROGRESSION
                | sys::JWRN_EXTRANEOUS_DATA
                | sys::JWRN_HIT_MARKER
                | sys::JWRN_HUFF_BAD_CODE
                | sys::JWRN_JPEG_EOF
                | sys::JWRN_MUST_RESYNC
                | sys::JWRN_NOT_SEQUENTIAL
                | sys::JWRN_TOO_MUCH_DATA
        )
    }
}

impl Warning {
    /// Whether the warning says the data ends before the image does: the file ends early ("premature end
    /// of JPEG file"), or a marker — an end-of-image appended to a cut file, say — ends a scan early
    /// ("premature end of data segment"). libjpeg fills the rest in grey.
    pub fn is_early_end(&self) -> bool {
        matches!(self.code, sys::JWRN_JPEG_EOF | sys::JWRN_HIT_MARKER)
    }
}

/// Output of [`transcode_progressive`].
pub struct Transcoded {
    pub jpeg: Vec<u8>,
    /// The number of scans libjpeg's progression script asked for.
    pub script_scans: usize,
    /// Warnings libjpeg emitted about the input (at most 8); see [`Warning::is_corrupt_data`].
    pub warnings: Vec<Warning>,
}

/// Formats libjpeg's current message through its own `format_message`.
///
/// # Safety
/// `cinfo.err` must point to a live error manager initialised by `jpeg_std_error`.
unsafe fn message(cinfo: &mut sys::jpeg_common_struct) -> String {
    let mut buf = [0u8; 80];
    // SAFETY: the caller guarantees `err` is live. `format_message` writes into its buffer argument, which
    // the binding types as `&[u8; 80]`; we call it through a pointer-typed signature (same ABI: one data
    // pointer) so Rust never sees a write through a shared reference.
    unsafe {
        if let Some(f) = (*cinfo.err).format_message {
            let f: unsafe extern "C-unwind" fn(&mut sys::jpeg_common_struct, *mut u8) =
                std::mem::transmute(f);
            f(cinfo, buf.as_mut_ptr());
        }
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

unsafe extern "C-unwind" fn error_exit(cinfo: &mut sys::jpeg_common_struct) {
    // SAFETY: libjpeg calls this with the struct whose `err` we set up in `ErrorMgr::attach`.
    let msg = unsafe { message(cinfo) };
    resume_unwind(Box::new(LibjpegError(msg)));
}

unsafe extern "C-unwind" fn emit_message(cinfo: &mut sys::jpeg_common_struct, level: c_int) {
    if level >= 0 {
        return; // trace messages
    }
    // SAFETY: `err` is live (see `error_exit`); `client_data` points at the `Vec<Warning>` owned by the
    // `ErrorMgr` that outlives the libjpeg object.
    unsafe {
        let text = message(cinfo);
        let code = (*cinfo.err).msg_code;
        (*cinfo.err).num_warnings += 1;
        let warnings = &mut *(cinfo.client_data as *mut Vec<Warning>);
        if warnings.len() < 8 {
            warnings.push(Warning { code, text });
        }
    }
}

unsafe extern "C-unwind" fn output_message(_cinfo: &mut sys::jpeg_common_struct) {}

/// The error manager and the warning list, boxed so their addresses stay fixed while libjpeg holds them.
struct ErrorMgr {
    err: Box<sys::jpeg_error_mgr>,
    // Boxed on purpose: libjpeg holds a pointer to the `Vec` itself, which must not move with `ErrorMgr`.
    #[allow(clippy::box_collection)]
    warnings: Box<Vec<Warning>>,
}

impl ErrorMgr {
    fn new() -> Self {
        // SAFETY: `jpeg_error_mgr` is plain C data (integers, pointers, optional function pointers), for
        // which all-zeroes is a valid value; `jpeg_std_error` then fills it in.
        let mut err: Box<sys::jpeg_error_mgr> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `err` is a live, exclusively borrowed `jpeg_error_mgr`; `jpeg_std_error` only fills in its
        // fields (the standard handlers, three of which are replaced below) and keeps no pointer to it.
        unsafe { sys::jpeg_std_error(&mut err) };
        err.error_exit = Some(error_exit);
        err.emit_message = Some(emit_message);
        err.output_message = Some(output_message);
        ErrorMgr {
            err,
            warnings: Box::default(),
        }
    }
    fn attach(&mut self, common: &mut sys::jpeg_common_struct) {
        common.err = &mut *self.err;
        common.client_data = &mut *self.warnings as *mut Vec<Warning> as *mut _;
    }
}

/// A decompressor that is destroyed on drop, whatever state an error left it in.
struct Decompress {
    cinfo: Box<sys::jpeg_decompress_struct>,
    errors: ErrorMgr,
}

impl Decompress {
    fn new() -> Result<Self, JpegError> {
        let mut errors = ErrorMgr::new();
        // SAFETY: all-zeroes is the documented starting state before `jpeg_create_decompress`.
        let mut cinfo: Box<sys::jpeg_decompress_struct> = Box::new(unsafe { std::mem::zeroed() });
        errors.attach(&mut cinfo.common);
        let mut d = Decompress { cinfo, errors };
        // `jpeg_create_decompress` resets the struct but keeps `err`; it can fail (out of memory).
        // SAFETY: `d.cinfo` is boxed (libjpeg keeps pointers into it) and zeroed with our error manager
        // attached, the state `jpeg_create_decompress` expects; its errors unwind out through `guard`.
        guard(|| unsafe { sys::jpeg_create_decompress(&mut *d.cinfo) })?;
        d.errors.attach(&mut d.cinfo.common);
        Ok(d)
    }
}

impl Drop for Decompress {
    fn drop(&mut self) {
        // SAFETY: destroy is valid in every state, including after an error unwound out of libjpeg;
        // it frees nothing when creation failed before `mem` was set.
        let _ = guard(|| unsafe { sys::jpeg_destroy_decompress(&mut self.cinfo) });
    }
}

/// A compressor that is destroyed on drop; it also owns the `jpeg_mem_dest` buffer.
struct Compress {
    cinfo: Box<sys::jpeg_compress_struct>,
    errors: ErrorMgr,
    out: Box<(*mut u8, c_ulong)>,
}

impl Compress {
    fn new() -> Result<Self, JpegError> {
        let mut errors = ErrorMgr::new();
        // SAFETY: as for `Decompress::new`.
        let mut cinfo: Box<sys::jpeg_compress_struct> = Box::new(unsafe { std::mem::zeroed() });
        errors.attach(&mut cinfo.common);
        let mut c = Compress {
            cinfo,
            errors,
            out: Box::new((std::ptr::null_mut(), 0)),
        };
        // SAFETY: as for `jpeg_create_decompress` in `Decompress::new`: a boxed, zeroed struct with our error
        // manager attached.
        guard(|| unsafe { sys::jpeg_create_compress(&mut *c.cinfo) })?;
        c.errors.attach(&mut c.cinfo.common);
        Ok(c)
    }
}

impl Drop for Compress {
    fn drop(&mut self) {
        // SAFETY: a `Compress` exists only once `jpeg_create_compress` succeeded, and destroying is valid in
        // every state a failed libjpeg call (unwound by `guard`) can leave the struct in.
        let _ = guard(|| unsafe { sys::jpeg_destroy_compress(&mut self.cinfo) });
        if !self.out.0.is_null() {
            // SAFETY: `jpeg_mem_dest` allocates with malloc and leaves freeing to the caller; the pointer
            // always holds its latest (re)allocation.
            unsafe { libc::free(self.out.0 as *mut libc::c_void) };
        }
    }
}

/// Runs libjpeg calls, turning an `error_exit` unwind into `Err(message)`; other panics keep unwinding.
fn guard<T>(f: impl FnOnce() -> T) -> Result<T, JpegError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Ok(v),
        Err(payload) => match payload.downcast::<LibjpegError>() {
            Ok(e) => Err(JpegError::Libjpeg(e.0)),
            Err(other) => resume_unwind(other),
        },
    }
}

/// Losslessly rewrites a JPEG as progressive JPEG with libjpeg's standard script (10 scans for YCbCr,
/// 6 for grayscale), dropping all APPn/COM markers.
pub fn transcode_progressive(input: &[u8]) -> Result<Transcoded, JpegError> {
    if input.is_empty() {
        return Err(JpegError::Empty);
    }
    let mut d = Decompress::new()?;
    let mut c = Compress::new()?;
    // SAFETY: `d` and `c` were created above with our error manager, whose `error_exit` unwinds out of
    // `guard` rather than returning into libjpeg; `input` is borrowed for this whole function, past every
    // read libjpeg makes from it; `coefs` belongs to `d`, alive until after `jpeg_finish_compress`; `c.out`
    // is boxed, so the pointer and length `jpeg_mem_dest` writes through stay put.
    let script_scans = guard(|| unsafe {
        sys::jpeg_mem_src(&mut d.cinfo, input.as_ptr(), input.len() as c_ulong);
        sys::jpeg_read_header(&mut d.cinfo, 1);
        let coefs = sys::jpeg_read_coefficients(&mut d.cinfo);
        // mozjpeg's default profile makes `jpeg_simple_progression` search an image-dependent script;
        // the fastest profile gives libjpeg-turbo's standard one. Must precede copying the parameters,
        // which calls `jpeg_set_defaults`.
        sys::jpeg_c_set_int_param(
            &mut c.cinfo,
            sys::JINT_COMPRESS_PROFILE,
            sys::JCP_FASTEST as c_int,
        );
        sys::jpeg_copy_critical_parameters(&d.cinfo, &mut c.cinfo);
        sys::jpeg_simple_progression(&mut c.cinfo);
        let scans = c.cinfo.num_scans;
        let out: &mut (*mut u8, c_ulong) = &mut c.out;
        sys::jpeg_mem_dest(&mut c.cinfo, &mut out.0, &mut out.1);
        sys::jpeg_write_coefficients(&mut c.cinfo, coefs);
        sys::jpeg_finish_compress(&mut c.cinfo);
        sys::jpeg_finish_decompress(&mut d.cinfo);
        scans
    })?;
    let (ptr, len) = *c.out;
    if ptr.is_null() {
        return Err(JpegError::NoOutput);
    }
    // SAFETY: after `jpeg_finish_compress`, `ptr` holds `len` initialised bytes written by libjpeg.
    let jpeg = unsafe { std::slice::from_raw_parts(ptr, len as usize) }.to_vec();
    Ok(Transcoded {
        jpeg,
        script_scans: script_scans.max(0) as usize,
        warnings: std::mem::take(&mut *d.errors.warnings),
    })
}

/// The colour a [`Reader`] decodes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Color {
    /// RGB always (a grayscale stream's value repeated).
    Rgb,
    /// Gray for a grayscale stream, RGB for every other (YCbCr, RGB, CMYK and YCCK converted).
    GrayOrRgb,
}

/// What a stream's header says, read before anything is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub width: u32,
    pub height: u32,
    /// Channels of the decoded pixels: 1 (gray) or 3 (RGB).
    pub channels: u8,
    /// The EXIF block of an APP1 segment (after its `Exif\0\0` tag), for the image's orientation.
    pub exif: Option<Vec<u8>>,
}

impl Header {
    /// Bytes of the decoded pixels: width × height × channels.
    pub fn decoded_len(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height) * u64::from(self.channels)
    }
}

/// A JPEG stream whose header has been read: [`header`](Self::header) tells its size before anything is
/// allocated for its pixels, [`decode_into`](Self::decode_into) decodes it.
pub struct Reader<'a> {
    d: Decompress,
    header: Header,
    /// libjpeg produces CMYK (from CMYK or YCCK data), converted to RGB here.
    cmyk: bool,
    /// libjpeg reads from this slice (`jpeg_mem_src`) until the reader is dropped.
    _input: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Reader<'a> {
    /// Reads the header of `jpeg` (up to the first scan): a stream libjpeg cannot parse is an error.
    pub fn new(jpeg: &'a [u8], color: Color) -> Result<Self, JpegError> {
        if jpeg.is_empty() {
            return Err(JpegError::Empty);
        }
        let mut d = Decompress::new()?;
        // SAFETY: `d` was created by `Decompress::new` with our error manager; `jpeg` is borrowed for `'a`,
        // which the returned `Reader` carries (`_input`), so the source buffer outlives every read libjpeg
        // makes from it, here and in the later decode.
        let (w, h, space) = guard(|| unsafe {
            sys::jpeg_mem_src(&mut d.cinfo, jpeg.as_ptr(), jpeg.len() as c_ulong);
            sys::jpeg_save_markers(&mut d.cinfo, 0xE1, 0xFFFF);
            sys::jpeg_read_header(&mut d.cinfo, 1);
            (
                d.cinfo.image_width,
                d.cinfo.image_height,
                d.cinfo.jpeg_color_space,
            )
        })?;
        let (out, channels, cmyk) = match (color, space) {
            (Color::GrayOrRgb, sys::J_COLOR_SPACE::JCS_GRAYSCALE) => {
                (sys::J_COLOR_SPACE::JCS_GRAYSCALE, 1, false)
            }
            (_, sys::J_COLOR_SPACE::JCS_CMYK | sys::J_COLOR_SPACE::JCS_YCCK) => {
                (sys::J_COLOR_SPACE::JCS_CMYK, 3, true)
            }
            _ => (sys::J_COLOR_SPACE::JCS_RGB, 3, false),
        };
        d.cinfo.out_color_space = out;
        // SAFETY: after `jpeg_read_header` the saved markers are a list owned by the decompressor.
        let exif = unsafe {
            let mut m = d.cinfo.marker_list;
            let mut found = None;
            while !m.is_null() && found.is_none() {
                let data = std::slice::from_raw_parts((*m).data, (*m).data_length as usize);
                if (*m).marker == 0xE1 && data.starts_with(b"Exif\0\0") {
                    found = Some(data[6..].to_vec());
                }
                m = (*m).next;
            }
            found
        };
        Ok(Reader {
            d,
            header: Header {
                width: w,
                height: h,
                channels,
                exif,
            },
            cmyk,
            _input: std::marker::PhantomData,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Decodes the image into `out` (resized to [`Header::decoded_len`]: check it first) with libjpeg's
    /// defaults (accurate integer IDCT, fancy upsampling, block smoothing of progressive images whose AC
    /// data is missing). Returns libjpeg's warnings (at most 8): where data is missing or corrupt it fills
    /// in and carries on, and only the warnings say so.
    pub fn decode_into(mut self, out: &mut Vec<u8>) -> Result<Vec<Warning>, JpegError> {
        let (w, h) = (self.header.width as usize, self.header.height as usize);
        let c = usize::from(self.header.channels);
        let cmyk = self.cmyk;
        let d = &mut self.d;
        let components = if cmyk { 4 } else { c };
        let stride = w * components;
        out.clear();
        out.resize(stride * h, 0);
        // SAFETY: `d` holds a header read by `Reader::new` from a buffer that outlives it. The output
        // geometry is checked equal to (w, h, components) before any scanline is read; each row pointer
        // then points at `stride` = width × components writable bytes of `out` (sized `stride * h`
        // above), and at most 4 rows, the length of `rows`, are asked for per call.
        guard(|| unsafe {
            sys::jpeg_start_decompress(&mut d.cinfo);
            let (ow, oh) = (
                d.cinfo.output_width as usize,
                d.cinfo.output_height as usize,
            );
            if d.cinfo.output_components as usize != components || ow != w || oh != h {
                return None;
            }
            while (d.cinfo.output_scanline as usize) < oh {
                let row = d.cinfo.output_scanline as usize;
                let n = (d.cinfo.rec_outbuf_height.max(1) as usize).min(oh - row);
                let mut rows: [*mut u8; 4] = [std::ptr::null_mut(); 4];
                for (i, r) in rows.iter_mut().enumerate().take(n.min(4)) {
                    *r = out[(row + i) * stride..].as_mut_ptr();
                }
                let got =
                    sys::jpeg_read_scanlines(&mut d.cinfo, rows.as_mut_ptr(), n.min(4) as u32);
                if got == 0 {
                    return None;
                }
            }
            sys::jpeg_finish_decompress(&mut d.cinfo);
            Some(())
        })?
        .ok_or_else(|| {
            JpegError::Libjpeg("unexpected output geometry or stalled decoder".into())
        })?;
        if cmyk {
            cmyk_to_rgb(out);
        }
        Ok(std::mem::take(&mut *d.errors.warnings))
    }
}

impl Reader<'_> {
    /// Entropy-decodes every scan to DCT coefficients without producing pixels (no IDCT, no colour
    /// conversion) and returns libjpeg's warnings: what [`decode_into`](Self::decode_into) would report
    /// about the data, at a fraction of its cost.
    pub fn check_coefficients(mut self) -> Result<Vec<Warning>, JpegError> {
        let d = &mut self.d;
        // SAFETY: `d` holds a header read by `Reader::new` from a buffer that outlives it; reading the
        // coefficients (kept in libjpeg's own arrays) and finishing need nothing else.
        guard(|| unsafe {
            sys::jpeg_read_coefficients(&mut d.cinfo);
            sys::jpeg_finish_decompress(&mut d.cinfo);
        })?;
        Ok(std::mem::take(&mut *d.errors.warnings))
    }
}

/// CMYK rows as libjpeg gives them for Adobe files (the only writers of CMYK JPEGs, storing inverted
/// values) to RGB in place: R = C·K / 255, and so on.
fn cmyk_to_rgb(px: &mut Vec<u8>) {
    let n = px.len() / 4;
    for i in 0..n {
        let (c, m, y, k) = (
            u32::from(px[4 * i]),
            u32::from(px[4 * i + 1]),
            u32::from(px[4 * i + 2]),
            u32::from(px[4 * i + 3]),
        );
        px[3 * i] = ((c * k + 127) / 255) as u8;
        px[3 * i + 1] = ((m * k + 127) / 255) as u8;
        px[3 * i + 2] = ((y * k + 127) / 255) as u8;
    }
    px.truncate(3 * n);
}

/// A decoded image: 8-bit RGB, row-major, no padding.
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Decodes a JPEG stream to RGB with libjpeg-turbo's defaults (accurate integer IDCT, fancy upsampling,
/// block smoothing of progressive images whose AC data is still missing). Any warning (premature end of
/// data, corrupt entropy data) is an error: streams rebuilt from verified records never raise one.
pub fn decode_rgb(jpeg: &[u8]) -> Result<Rgb, JpegError> {
    let r = Reader::new(jpeg, Color::Rgb)?;
    let (w, h) = (r.header().width, r.header().height);
    if u64::from(w) * u64::from(h) > MAX_PIXELS {
        return Err(JpegError::TooLarge {
            width: w,
            height: h,
            max: MAX_PIXELS,
        });
    }
    let mut pixels = Vec::new();
    let warnings = r.decode_into(&mut pixels)?;
    if let Some(first) = warnings.first() {
        return Err(JpegError::Warning(first.text.clone()));
    }
    Ok(Rgb {
        width: w,
        height: h,
        pixels,
    })
}
