//! Decoding a region: only the patches under a rectangle, straight into the caller's buffer at the caller's
//! strides. L3 patches are independent, so a 224×224 crop of a 3840×2160 image touches 12 to 20 of its 2040
//! patches per channel.
//!
//! One path serves a whole file in memory ([`crate::L3File::decode_region`]) and a file of which only the
//! needed byte ranges were read ([`crate::L3Index::decode_region`]): the region and the buffer are checked
//! here, then version 1's or version 2's region decoder asks for each offset-table entry's bytes through a
//! closure.

use crate::error::Error;
use crate::geometry::Geometry;
use crate::pixel_layout::PixelLayout;
use crate::v1;
use crate::v2::{self, AnsTables};
use vocab::Rect;

/// Decodes `region` of a file of geometry `g` into `out` at `layout`'s strides, after checking both:
/// `tables` are the file's v2-ANS tables (`None` otherwise), `entry(i)` gives the bytes of offset-table
/// entry i. The pixels equal the same rectangle of a whole-image decode.
pub(crate) fn decode<'d>(
    g: &Geometry,
    tables: Option<&AnsTables>,
    region: Rect,
    out: &mut [u8],
    layout: PixelLayout,
    entry: impl Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    check(g, region, out, layout)?;
    match g.profile {
        None => {
            let per = g.patches_per_channel();
            v1::region::decode(g, region, out, layout, |ch, p| entry(ch * per + p))
        }
        Some(profile) => v2::decode::region(g, profile, tables, region, out, layout, &entry),
    }
}

/// Checks the region and the buffer before any decoding.
fn check(g: &Geometry, region: Rect, out: &[u8], layout: PixelLayout) -> Result<(), Error> {
    if !region.fits(g.width, g.height) {
        return Err(Error::BadRegion {
            region,
            width: g.width,
            height: g.height,
        });
    }
    let needed = layout
        .required_len(region.w, region.h, g.channels)
        .ok_or(Error::BadLayout { layout, region })?;
    if out.len() < needed {
        return Err(Error::BufferSize {
            expected: needed,
            got: out.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{L3File, encode};

    #[test]
    fn bad_regions_and_buffers_are_errors() {
        let px = vec![7u8; 10 * 6 * 3];
        let file = encode(&px, 10, 6, 3, 4).unwrap();
        let f = L3File::parse(&file).unwrap();
        let mut out = vec![0u8; 1000];
        let packed = PixelLayout::Interleaved { row_stride: 30 };
        for r in [
            Rect::new(0, 0, 0, 1),
            Rect::new(9, 0, 2, 1),
            Rect::new(0, 5, 1, 2),
        ] {
            assert!(matches!(
                f.decode_region(r, &mut out, packed),
                Err(Error::BadRegion { .. })
            ));
        }
        let r = Rect::new(0, 0, 10, 6);
        assert!(matches!(
            f.decode_region(r, &mut out, PixelLayout::Interleaved { row_stride: 29 }),
            Err(Error::BadLayout { .. })
        ));
        assert!(matches!(
            f.decode_region(r, &mut out[..179], packed),
            Err(Error::BufferSize { .. })
        ));
        let e = f
            .decode_region(
                r,
                &mut out,
                PixelLayout::Planar {
                    row_stride: 10,
                    plane_stride: 50,
                },
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "output strides (planar, row stride 10, plane stride 50) cannot hold a region 10x6 at (0, 0)"
        );
    }
}
