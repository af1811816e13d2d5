//! Resume states against the dataset and the options they are handed: the dataset a state names, the
//! spellings of a targets path, the fields a run cannot count on from, and one epoch per loop after an
//! elastic resume.

mod common;

use common::{copy_tree, fixture};
use loader::{
    Dataset, Error, ImageFolder, Layout, Loader, LoaderOptions, LoaderState, SampleSpec,
    TargetOptions,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn opts(batch: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        decode_threads: 2,
        io_threads: 1,
        prefetch: 2,
        seed: 7,
        epochs: None,
        sample: SampleSpec {
            height: 8,
            width: 8,
            layout: Layout::Nhwc,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn folder(p: &Path) -> Arc<dyn Dataset> {
    Arc::new(ImageFolder::open(p).expect("open folder"))
}

fn refused(ds: &Arc<dyn Dataset>, o: &LoaderOptions, st: LoaderState) -> String {
    match Loader::resume(ds.clone(), o.clone(), st) {
        Err(Error::Resume(why)) => why,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("resumed"),
    }
}

/// The state after one batch of a run over `ds`, through its text (as a checkpoint keeps it).
fn saved(ds: &Arc<dyn Dataset>, o: &LoaderOptions) -> LoaderState {
    let mut l = Loader::new(ds.clone(), o.clone()).unwrap();
    l.next().unwrap().unwrap();
    l.state().to_string().parse().unwrap()
}

#[test]
fn a_state_of_another_dataset_of_the_same_length_is_refused_naming_it() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let (a, renamed, resized) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    for d in [&a, &renamed, &resized] {
        copy_tree(&f.raw, d);
    }
    // One item under another name; one item a byte longer: the same length, other datasets.
    let files = loader::image_files(&a).unwrap().files;
    let first = &files[0].0;
    let moved = first.with_file_name(format!(
        "zz-{}",
        first.file_name().unwrap().to_string_lossy()
    ));
    std::fs::rename(renamed.join(first), renamed.join(moved)).unwrap();
    let mut bytes = std::fs::read(resized.join(first)).unwrap();
    bytes.push(0);
    std::fs::write(resized.join(first), bytes).unwrap();
    let o = opts(4);
    let state = saved(&folder(&a), &o);
    assert!(state.fingerprint.is_some(), "{state}");
    for other in [&renamed, &resized] {
        let ds = folder(other);
        assert_eq!(ds.len(), state.dataset_len);
        let why = refused(&ds, &o, state.clone());
        assert!(
            why.contains("another dataset") && why.contains(&other.display().to_string()),
            "{why}"
        );
    }
    // The same folder however its path is spelled, or a copy of it elsewhere.
    let copy = tmp.path().join("copy");
    copy_tree(&a, &copy);
    for spelling in [
        PathBuf::from(format!("{}/", a.display())),
        a.join("."),
        tmp.path().join("b").join("..").join("a"),
        copy,
    ] {
        let l = Loader::resume(folder(&spelling), o.clone(), state.clone());
        assert!(l.is_ok(), "{}: {}", spelling.display(), l.err().unwrap());
    }
}

/// A state saved before states named their dataset (version 2) still resumes, checked by length, and
/// the resumed run's states name it.
#[test]
fn a_state_without_a_fingerprint_resumes_and_gains_one() {
    let f = fixture();
    let ds = folder(&f.raw);
    let o = opts(4);
    let state = saved(&ds, &o);
    let fingerprint = state.fingerprint.clone().unwrap();
    let text = state
        .to_string()
        .replace(&format!(",\"fingerprint\":\"{fingerprint}\""), "")
        .replace("\"version\":3", "\"version\":2");
    let older: LoaderState = text.parse().unwrap();
    assert_eq!(older.fingerprint, None);
    let mut l = Loader::resume(ds.clone(), o.clone(), older).unwrap();
    assert_eq!(l.state().fingerprint.as_deref(), Some(fingerprint.as_str()));
    l.next().unwrap().unwrap();
    assert_eq!(l.state().fingerprint, Some(fingerprint));
}

#[test]
fn a_position_no_run_can_count_on_from_is_refused_by_field() {
    let f = fixture();
    let ds = folder(&f.raw);
    let o = opts(4);
    let state = saved(&ds, &o);
    let at = |epoch: usize, rank: usize, world_size: usize| LoaderState {
        epoch,
        rank,
        world_size,
        ..state.clone()
    };
    let why = refused(&ds, &o, at(usize::MAX, 0, 1));
    assert!(
        why.contains("epoch 18446744073709551615") && why.contains("last epoch"),
        "{why}"
    );
    let why = refused(&ds, &o, at(loader::MAX_EPOCH + 1, 0, 1));
    assert!(why.contains("last epoch"), "{why}");
    let l = Loader::resume(ds.clone(), o.clone(), at(loader::MAX_EPOCH, 0, 1)).unwrap();
    assert_eq!(l.state().epoch, loader::MAX_EPOCH);
    let why = refused(&ds, &o, at(0, 1, 1));
    assert!(why.contains("rank 1 of world size 1"), "{why}");
    let why = refused(&ds, &o, at(0, 0, usize::MAX));
    assert!(why.contains("world size"), "{why}");
}

/// One `rest_of_epoch` loop after a resume at another world size and batch size is the rest of the
/// saved epoch — what a run bounded to that epoch delivers — and the next loop the next epoch, as for a
/// fresh loader.
#[test]
fn after_an_elastic_resume_one_loop_is_the_rest_of_the_saved_epoch() {
    let f = fixture();
    let ds = folder(&f.raw);
    let shaped = |rank: usize, world: usize, batch: usize| LoaderOptions {
        rank,
        world_size: world,
        ..opts(batch)
    };
    let mut first = Loader::new(ds.clone(), shaped(0, 2, 4)).unwrap();
    let per_epoch = first.batches_per_epoch();
    assert_eq!(first.rest_of_epoch().count(), per_epoch);
    assert_eq!(first.state().epoch, 1);
    // 18 items: 8 delivered by 2 ranks of 4; the 10 left are 2 batches of 2 for each of 3 ranks, whose
    // whole epoch is 3.
    let state = saved(&ds, &shaped(0, 2, 4));
    for rank in 0..3 {
        let o = shaped(rank, 3, 2);
        let mut l = Loader::resume(ds.clone(), o.clone(), state.clone()).unwrap();
        let rest: Vec<Vec<usize>> = l
            .rest_of_epoch()
            .map(|b| b.unwrap())
            .inspect(|b| assert_eq!(b.epoch, 0))
            .map(|b| b.ids)
            .collect();
        let bounded = LoaderOptions {
            epochs: Some(1),
            ..o.clone()
        };
        let want: Vec<Vec<usize>> = Loader::resume(ds.clone(), bounded, state.clone())
            .unwrap()
            .map(|b| b.unwrap().ids)
            .collect();
        assert_eq!(rest, want, "rank {rank}");
        assert!(rest.len() < l.batches_per_epoch(), "rank {rank}");
        let next: Vec<usize> = l.rest_of_epoch().map(|b| b.unwrap().epoch).collect();
        assert_eq!(next, vec![1; l.batches_per_epoch()], "rank {rank}");
    }
}

/// The masks folder a state recorded, spelled another way (relative, `./`, a trailing `/`, absolute):
/// the same folder, so the state resumes; another folder is refused by name.
#[test]
fn a_masks_path_spelled_another_way_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks) = (tmp.path().join("images"), tmp.path().join("masks"));
    for i in 0..6u8 {
        for (root, img) in [
            (&images, image::DynamicImage::new_rgb8(10, 12)),
            (&masks, image::DynamicImage::new_luma8(10, 12)),
        ] {
            std::fs::create_dir_all(root.join("c")).unwrap();
            img.save(root.join("c").join(format!("x{i}.png"))).unwrap();
        }
    }
    let other = tmp.path().join("other");
    copy_tree(&masks, &other);
    let ds = folder(&images);
    let with = |m: PathBuf| LoaderOptions {
        targets: TargetOptions {
            masks: Some(m),
            ..TargetOptions::default()
        },
        ..opts(2)
    };
    let state = saved(&ds, &with(masks.clone()));
    let cwd = std::env::current_dir().unwrap();
    let up: PathBuf = cwd.components().skip(1).map(|_| "..").collect();
    let relative = up.join(masks.strip_prefix("/").unwrap());
    for spelling in [
        relative.clone(),
        Path::new(".").join(&relative),
        PathBuf::from(format!("{}/", masks.display())),
        masks.join("."),
    ] {
        let l = Loader::resume(ds.clone(), with(spelling.clone()), state.clone());
        assert!(l.is_ok(), "{}: {}", spelling.display(), l.err().unwrap());
    }
    let why = refused(&ds, &with(other), state);
    assert!(why.contains("state has masks"), "{why}");
}
