//! [`LoaderState`]: where a loader stands, and its text form.

use crate::error::{Error, Result};
use crate::options::{LoaderOptions, Order};

/// Where a loader stands: the next batch it will deliver. Save it with a checkpoint and hand it to
/// [`Loader::resume`] to continue exactly there. Its `Display` form parses back with `FromStr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoaderState {
    pub epoch: usize,
    pub batch: usize,
    /// The configuration the position is valid for (checked on resume).
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    pub batch_size: usize,
    pub dataset_len: usize,
    /// The positions in `epoch`'s global order (see `ShardedOrder::permutation`) that the batches
    /// counted by `batch` are drawn from: `None` for the whole epoch; fewer once an epoch was resumed at
    /// another world size or batch size, which splits what was left among the new ranks.
    pub remaining: Option<Vec<std::ops::Range<usize>>>,
    /// What decides each batch's contents besides the seed (crop, flip, shuffle, layout, ...), as
    /// [`LoaderState::contents_of`] writes it: a resume with other such options is refused, naming the
    /// option. `None` (a version-1 state, or a caller that checks options itself): not checked.
    pub contents: Option<String>,
}

impl LoaderState {
    /// The options that decide what each batch holds besides the seed, as `name:value` pairs joined by
    /// `;` (one word, so a state stays one line of `name=value` words).
    pub fn contents_of(o: &LoaderOptions) -> String {
        let s = &o.sample;
        let normalize = s.normalize.map_or_else(
            || "none".to_string(),
            |n| {
                let join = |v: [f32; 3]| v.map(|x| x.to_string()).join(",");
                format!("{}/{}", join(n.mean), join(n.std))
            },
        );
        let order = match o.order {
            Order::Seeded => "seeded".to_string(),
            Order::Liquid { budget_bytes } => format!("liquid/{budget_bytes}"),
        };
        let active = s.recipe.option();
        let recipe = ["scale", "resize", "jitter"]
            .map(|k| match &active {
                Some((a, v)) if *a == k => format!("{k}:{v}"),
                _ => format!("{k}:none"),
            })
            .join(";");
        // Whole images: `crop:none` with their sizing (`none/resize 800/max_size 1333`).
        let size = match &active {
            Some(("crop", v)) => v.clone(),
            _ => format!("{}x{}", s.height, s.width),
        };
        format!(
            "crop:{size},{};flip:{};shuffle:{};drop_last:{};shard_tail:{};layout:{};dtype:{};normalize:{};\
             {recipe};interpolation:{};fill:{};channels:{};order:{}{}",
            s.crop,
            u8::from(s.hflip),
            u8::from(o.shuffle),
            u8::from(o.drop_last),
            o.shard_tail,
            s.layout,
            s.dtype,
            normalize,
            s.interpolation,
            s.fill,
            s.channels,
            order,
            o.targets.contents()
        )
    }

    /// The state format [`Display`](std::fmt::Display) writes: 2 added `remaining`; 1 (seven fields)
    /// still reads.
    pub const VERSION: u32 = 2;

    /// `remaining` as text: `all`, or half-open ranges `a:b` joined by commas (`none` when empty).
    pub fn remaining_text(&self) -> String {
        match &self.remaining {
            None => "all".into(),
            Some(r) if r.is_empty() => "none".into(),
            Some(r) => r
                .iter()
                .map(|r| format!("{}:{}", r.start, r.end))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Reads what [`remaining_text`](Self::remaining_text) writes.
    pub fn parse_remaining(text: &str) -> Result<Option<Vec<std::ops::Range<usize>>>> {
        let bad = || Error::Resume(format!("remaining={text:?}: expected all, none or a:b,c:d"));
        match text {
            "all" => return Ok(None),
            "none" => return Ok(Some(Vec::new())),
            _ => {}
        }
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        for part in text.split(',') {
            let (a, b) = part.split_once(':').ok_or_else(bad)?;
            let (a, b): (usize, usize) =
                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a >= b || out.last().is_some_and(|l| l.end > a) {
                return Err(bad());
            }
            out.push(a..b);
        }
        Ok(Some(out))
    }
}

impl std::fmt::Display for LoaderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch={} batch={} seed={} rank={} world_size={} batch_size={} dataset_len={} remaining={}",
            self.epoch,
            self.batch,
            self.seed,
            self.rank,
            self.world_size,
            self.batch_size,
            self.dataset_len,
            self.remaining_text(),
        )?;
        if let Some(c) = &self.contents {
            write!(f, " contents={c}")?;
        }
        write!(f, " version={}", Self::VERSION)
    }
}

/// The fields of a state string, in the order `Display` writes them.
const STATE_FIELDS: [&str; 7] = [
    "epoch",
    "batch",
    "seed",
    "rank",
    "world_size",
    "batch_size",
    "dataset_len",
];

impl std::str::FromStr for LoaderState {
    type Err = Error;
    /// Every field exactly once: a partial state would resume somewhere else (a missing field read as 0
    /// restarts the epoch, or skips the checks against the dataset), so it is refused, naming what lacks.
    fn from_str(s: &str) -> Result<Self> {
        let mut values: [Option<u64>; 7] = [None; 7];
        let bad = |why: String| Error::Resume(format!("unreadable state {s:?}: {why}"));
        let (mut remaining, mut version, mut contents) = (None, None, None);
        for kv in s.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("{kv:?} is not name=value")))?;
            if k == "remaining" || k == "version" || k == "contents" {
                let slot = match k {
                    "remaining" => &mut remaining,
                    "version" => &mut version,
                    _ => &mut contents,
                };
                if slot.replace(v).is_some() {
                    return Err(bad(format!("{k} given twice")));
                }
                continue;
            }
            let i = STATE_FIELDS
                .iter()
                .position(|f| *f == k)
                .ok_or_else(|| bad(format!("no field named {k:?}")))?;
            let n: u64 = v
                .parse()
                .map_err(|_| bad(format!("{k}={v:?} is not a whole number")))?;
            if values[i].replace(n).is_some() {
                return Err(bad(format!("{k} given twice")));
            }
        }
        let missing: Vec<&str> = STATE_FIELDS
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(f, _)| *f)
            .collect();
        if !missing.is_empty() {
            return Err(bad(format!(
                "{} missing (a state names {})",
                missing.join(", "),
                STATE_FIELDS.join(", ")
            )));
        }
        match version {
            None | Some("1") | Some("2") => {}
            Some(v) => {
                return Err(bad(format!(
                    "version {v}: this build reads versions 1 and {}",
                    Self::VERSION
                )));
            }
        }
        let remaining = remaining.map_or(Ok(None), Self::parse_remaining)?;
        let v = values.map(|v| v.unwrap_or(0));
        let size = |n: u64| usize::try_from(n).map_err(|_| bad(format!("{n} is too large")));
        Ok(LoaderState {
            remaining,
            contents: contents.map(str::to_string),
            epoch: size(v[0])?,
            batch: size(v[1])?,
            seed: v[2],
            rank: size(v[3])?,
            world_size: size(v[4])?,
            batch_size: size(v[5])?,
            dataset_len: size(v[6])?,
        })
    }
}

#[cfg(test)]
mod state_tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_a_partial_one_is_refused() {
        let st = LoaderState {
            epoch: 3,
            batch: 17,
            seed: u64::MAX,
            rank: 1,
            world_size: 4,
            batch_size: 64,
            dataset_len: 5000,
            remaining: Some(vec![3..9, 12..4000]),
            contents: Some(LoaderState::contents_of(&LoaderOptions::default())),
        };
        let text = st.to_string();
        assert!(
            text.contains(" remaining=3:9,12:4000 contents=crop:"),
            "{text}"
        );
        assert!(text.ends_with(" version=2"), "{text}");
        assert_eq!(text.parse::<LoaderState>().unwrap(), st);
        // A version-1 state (seven fields) still reads: the whole epoch.
        let old: LoaderState =
            "epoch=3 batch=17 seed=1 rank=0 world_size=4 batch_size=64 dataset_len=5000"
                .parse()
                .unwrap();
        assert_eq!(old.remaining, None);
        for bad in [
            "remaining=5:3",
            "remaining=1:4,2:6",
            "remaining=x",
            "version=3",
        ] {
            let e = format!("{text} {bad}")
                .replace(" remaining=3:9,12:4000", "")
                .replace(" version=2", "");
            assert!(e.parse::<LoaderState>().is_err(), "{bad} accepted");
        }
        let back: LoaderState = text.parse().unwrap();
        assert_eq!(back.to_string(), text);
        for (input, says) in [
            (
                "epoch=3 batch=17",
                "seed, rank, world_size, batch_size, dataset_len missing",
            ),
            ("", "epoch, batch, seed"),
            (&format!("{text} batch=2"), "batch given twice"),
            ("epoch=x", "not a whole number"),
            ("epoch", "not name=value"),
            (&format!("{text} step=1"), "no field named \"step\""),
        ] {
            let e = input.parse::<LoaderState>().unwrap_err().to_string();
            assert!(e.contains(says), "{input:?}: {e}");
        }
    }

    /// States written by earlier builds, kept byte for byte: each still loads, with what it said.
    #[test]
    fn states_saved_by_earlier_builds_still_load() {
        let v2_part: LoaderState = include_str!("fixtures/v2-part.state")
            .trim()
            .parse()
            .unwrap();
        assert_eq!(
            (v2_part.epoch, v2_part.batch, v2_part.seed, v2_part.rank),
            (3, 17, 42, 1)
        );
        assert_eq!(
            (v2_part.world_size, v2_part.batch_size, v2_part.dataset_len),
            (4, 64, 5000)
        );
        assert_eq!(v2_part.remaining, Some(vec![3..9, 12..4000]));
        let mut with_masks = LoaderOptions::default();
        with_masks.targets.masks = Some("masks".into());
        assert_eq!(
            v2_part.contents,
            Some(LoaderState::contents_of(&with_masks))
        );
        let v2_epoch: LoaderState = include_str!("fixtures/v2-epoch.state")
            .trim()
            .parse()
            .unwrap();
        assert_eq!(v2_epoch.remaining, None);
        assert_eq!(
            v2_epoch.contents,
            Some(LoaderState::contents_of(&LoaderOptions::default()))
        );
        let v1: LoaderState = include_str!("fixtures/v1.state").trim().parse().unwrap();
        assert_eq!((v1.epoch, v1.batch, v1.seed), (3, 17, 1));
        assert_eq!((v1.remaining, v1.contents), (None, None));
    }
}
