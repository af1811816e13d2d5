//! Decode L3 images on the GPU: a whole-image batch into a normalised NCHW f16 tensor, then a batch of
//! training samples (a random crop of each image, mirrored, padding where an image is smaller than the
//! sample) that stays on the device.
//! Run: `cargo run -p l3-cuda --example decode_batch`. Without a GPU it plans both batches on the host,
//! says why the GPU is unavailable and exits cleanly.
use l3_cuda::{BatchDecoder, DecodeOptions, Rect, SampleOptions, SamplePlan, SampleSource};
use vocab::{DType, Layout, Normalize, Window};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Two 64×48 RGB images of a gradient and one 20×10 gray image, encoded on the CPU.
    let (w, h) = (64u32, 48u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
    let file = l3_format::encode(&px, w, h, 3, 32)?;
    let gray = l3_format::encode(&[128u8; 200], 20, 10, 1, 16)?;
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
        "whole images: {} patches in one launch, output {} f16 elements",
        plan.patch_count(),
        plan.output_len()
    );

    // Samples: 32×32 crops at a corner, in the middle (mirrored), and the gray image centred with padding.
    let sources = [
        SampleSource::File(&file),
        SampleSource::File(&file),
        SampleSource::File(&gray),
    ];
    let windows = [
        Window::new(Rect::new(0, 0, 32, 32), 0, 0, false),
        Window::new(Rect::new(16, 8, 32, 32), 0, 0, true),
        Window::new(Rect::new(0, 0, 20, 10), 6, 11, false),
    ];
    let sample_opts = SampleOptions {
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        ..SampleOptions::new(32, 32)
    };
    let sample_plan = SamplePlan::new(&sources, &windows, &sample_opts)?;
    println!(
        "samples: tensor {:?}, {} of {} compressed bytes copied, {} patch blocks + {} padding blocks",
        sample_plan.tensor().shape,
        sample_plan.input_len(),
        2 * file.len() + gray.len(),
        sample_plan.patch_count(),
        sample_plan.fill_count()
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
    let samples = decoder.submit_samples(&sources, &windows, &sample_opts)?;
    let compute = decoder.high_priority_stream()?;
    compute.wait(samples.ready())?;
    println!(
        "samples on device {} at {:#x}: {:?}, {} bytes",
        samples.device_ordinal(),
        samples.device_ptr(),
        samples.tensor(),
        samples.byte_len()
    );
    samples.wait()?;
    Ok(())
}
