//! Decode a batch of L3 images on the GPU into a normalised NCHW f16 tensor.
//! Run: `cargo run -p l3-cuda --example decode_batch`. Without a GPU it says why and exits cleanly.
use l3_cuda::{BatchDecoder, DType, DecodeOptions, Layout, Normalize};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Two 64×48 RGB images of a gradient, encoded on the CPU.
    let (w, h) = (64u32, 48u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
    let file = l3_format::encode(&px, w, h, 3, 32)?;
    let images: Vec<&[u8]> = vec![&file, &file];
    let opts = DecodeOptions {
        layout: Layout::Nchw,
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        ..Default::default()
    };
    // Host validation and layout, no GPU needed: where each image lands in the output tensor.
    let plan = l3_cuda::BatchPlan::new(&images, &opts)?;
    println!(
        "{} patches in one launch, output {} f16 elements",
        plan.patch_count(),
        plan.output_len()
    );

    let mut decoder = match BatchDecoder::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("GPU unavailable: {e}");
            return Ok(());
        }
    };
    // A training loop would make its (high-priority) compute stream wait on `batch.ready()` instead.
    let batch = decoder.submit(&images, &opts)?;
    batch.wait()?;
    for slot in batch.images() {
        println!(
            "image at element {}: {}x{}x{}",
            slot.offset, slot.width, slot.height, slot.channels
        );
    }
    Ok(())
}
