//! Host validation of a batch of untrusted files: `BatchPlan::new` (with and without the host row walk) must
//! return an error or a plan whose every descriptor lies inside the packed input and the output, never panic.
//! Input: first byte = number of files (1..=4), then the files split at evenly spaced cut points; a valid
//! seed file is mixed in so the fuzzer reaches the row walk quickly.
#![no_main]
use l3_cuda::{BatchPlan, DecodeOptions, Layout};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize % 4) + 1;
    let chunk = rest.len() / n;
    let mut files: Vec<&[u8]> = (0..n)
        .map(|i| {
            &rest[i * chunk..if i + 1 == n {
                rest.len()
            } else {
                (i + 1) * chunk
            }]
        })
        .collect();
    let seed = l3_format::encode(&[7u8; 5 * 3 * 3], 5, 3, 3, 2).unwrap();
    files.push(&seed);
    for (layout, check_rows_on_host) in [(Layout::Nchw, false), (Layout::Nhwc, true)] {
        let opts = DecodeOptions {
            layout,
            dtype: l3_cuda::DType::U8,
            normalize: None,
            check_rows_on_host,
        };
        if let Ok(plan) = BatchPlan::new(&files, &opts) {
            let out: usize = plan.images().iter().map(|s| s.len()).sum();
            assert_eq!(out, plan.output_len());
            assert!(plan.patch_count() > 0);
            assert!(plan.descriptors_in_bounds());
        }
    }
});
