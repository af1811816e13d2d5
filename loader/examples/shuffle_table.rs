//! The PCR window trade-off as a table (the one in the loader README): shuffle statistics of PCR's
//! record-aware order for several windows, beside a uniform shuffle, for a dataset stored class-sorted
//! (as an image-folder walk stores it) in records of PCR's default size. Computed from the schedule
//! alone: `cargo run --release -p loader --example shuffle_table`.

use loader::{LoaderOptions, ShuffleReport};

fn main() {
    let (items, classes, per_record, batch) = (102_400usize, 100usize, 1024usize, 256usize);
    let labels: Vec<u32> = (0..items).map(|i| (i * classes / items) as u32).collect();
    let records: Vec<usize> = (0..items).step_by(per_record).collect();
    let o = LoaderOptions {
        batch_size: batch,
        seed: 1,
        ..LoaderOptions::default()
    };
    println!(
        "{items} items in {classes} classes stored class-sorted, {} records of {per_record}, batch {batch}, 4 epochs\n",
        records.len()
    );
    println!(
        "| window (records) | prefixes held | order correlation | neighbours in one batch | batch span | label entropy (bits) |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut uniform = None;
    for window in [1, 2, 4, 8, 16, 32] {
        let r = ShuffleReport::for_layout(&labels, &records, Some(window), &o, 4);
        let v = |n: &str| r.stat(n).unwrap().order;
        println!(
            "| {window} | {} | {:.4} | {:.4} | {:.3} | {:.2} |",
            2 * window + 2,
            v("order_correlation"),
            v("neighbours_same_batch"),
            v("batch_span"),
            v("label_entropy_bits")
        );
        uniform = Some(r);
    }
    let r = uniform.unwrap();
    let u = |n: &str| r.stat(n).unwrap().uniform;
    println!(
        "| uniform shuffle | — | {:.4} | {:.4} | {:.3} | {:.2} |",
        u("order_correlation"),
        u("neighbours_same_batch"),
        u("batch_span"),
        u("label_entropy_bits")
    );
}
