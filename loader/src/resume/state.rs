//! [`LoaderState`]: where a loader stands, and its saved form (one line of JSON through serde; the
//! `name=value` words earlier builds wrote still read).

use crate::error::{Error, Result};
use crate::options::{LoaderOptions, Order};

/// Where a loader stands: the next batch it will deliver. Save it with a checkpoint and hand it to
/// [`Loader::resume`](crate::Loader::resume) to continue exactly there. Its `Display` form (one line of
/// JSON) parses back with `FromStr`.
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
    /// The fingerprint of the dataset the state was saved on (32 hex digits: see the loader's README,
    /// "resume"): a resume on a dataset with another one is refused, even one of the same length.
    /// `None` (a state from a build before version 3): only `dataset_len` identifies the dataset. A
    /// loader's own states always carry it.
    pub fingerprint: Option<String>,
}

impl LoaderState {
    /// The options that decide what each batch holds besides the seed, as `name:value` pairs joined by
    /// `;` (one word, as earlier builds wrote it among a state's `name=value` words).
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

    /// The version of the state's fields (whatever their encoding): 3 added `fingerprint`, 2
    /// `remaining`; 1 (seven fields) still reads.
    pub const VERSION: u32 = 3;

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
        remaining_from(text).map_err(Error::Resume)
    }

    /// A state from the JSON object of its fields, as [`Display`](std::fmt::Display) writes it: what a
    /// caller that keeps the fields in its own form (Python's `state_dict()`) hands over, so that every
    /// field is checked the one way. A refusal names the field, not the whole text.
    pub fn from_json_fields(json: &str) -> Result<Self> {
        read(json).map_err(Error::Resume)
    }
}

/// Reads what [`LoaderState::remaining_text`] writes.
fn remaining_from(text: &str) -> std::result::Result<Option<Vec<std::ops::Range<usize>>>, String> {
    let bad = || {
        format!(
            "remaining={}: expected all, none or a:b,c:d",
            stdx::Quoted(text)
        )
    };
    match text {
        "all" => return Ok(None),
        "none" => return Ok(Some(Vec::new())),
        _ => {}
    }
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for part in text.split(',') {
        let (a, b) = part.split_once(':').ok_or_else(bad)?;
        let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        if a >= b || out.last().is_some_and(|l| l.end > a) {
            return Err(bad());
        }
        out.push(a..b);
    }
    Ok(Some(out))
}

/// A state as it is saved: [`LoaderState`]'s fields, `remaining` in its text form
/// ([`LoaderState::remaining_text`]) and the version of the fields. One line of JSON; the `name=value`
/// words that versions 1 and 2 were written as are read into the same form (see [`words`]).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    epoch: usize,
    batch: usize,
    seed: u64,
    rank: usize,
    world_size: usize,
    batch_size: usize,
    dataset_len: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remaining: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    contents: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fingerprint: Option<String>,
    version: u32,
}

impl std::fmt::Display for LoaderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let saved = Saved {
            epoch: self.epoch,
            batch: self.batch,
            seed: self.seed,
            rank: self.rank,
            world_size: self.world_size,
            batch_size: self.batch_size,
            dataset_len: self.dataset_len,
            remaining: Some(self.remaining_text()),
            contents: self.contents.clone(),
            fingerprint: self.fingerprint.clone(),
            version: Self::VERSION,
        };
        let json = serde_json::to_string(&saved).map_err(|_| std::fmt::Error)?;
        f.write_str(&json)
    }
}

/// The numeric fields of a state, as versions 1 and 2 wrote them in words.
const NUMBERS: [&str; 8] = [
    "epoch",
    "batch",
    "seed",
    "rank",
    "world_size",
    "batch_size",
    "dataset_len",
    "version",
];

/// A state written as `name=value` words (versions 1 and 2: `epoch=3 batch=17 ... version=2`, version 1
/// without `remaining`, `contents` and `version`) as the JSON object it stands for, for the one reader.
/// A word that is not `name=value`, or a name given twice, is refused here; everything else — unknown,
/// missing or mistyped fields — by the reader, naming the field.
fn words(s: &str) -> std::result::Result<serde_json::Value, String> {
    let mut fields = serde_json::Map::new();
    for kv in s.split_whitespace() {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("{} is not name=value", stdx::Quoted(kv)))?;
        let value = match v.parse::<u64>() {
            Ok(n) if NUMBERS.contains(&k) => serde_json::Value::from(n),
            _ => serde_json::Value::from(v),
        };
        if fields.insert(k.to_string(), value).is_some() {
            return Err(format!("{} given twice", stdx::Quoted(k)));
        }
    }
    fields
        .entry("version")
        .or_insert_with(|| serde_json::Value::from(1));
    Ok(serde_json::Value::Object(fields))
}

/// Hex digits of a dataset fingerprint.
const FINGERPRINT_DIGITS: usize = 32;

/// Every field exactly once: a partial state would resume somewhere else (a missing field read as 0
/// restarts the epoch, or skips the checks against the dataset), so it is refused, naming the field.
/// The reason, bounded: serde's own words quote the offending value whole.
fn read(s: &str) -> std::result::Result<LoaderState, String> {
    // The path names a field, or the unknown key the input gave: bounded with the reason.
    let field = |path: String, why: String| match path.as_str() {
        "." => clipped(why),
        _ => clipped(format!("{path}: {why}")),
    };
    let saved: Saved = if s.trim_start().starts_with('{') {
        let mut json = serde_json::Deserializer::from_str(s);
        serde_path_to_error::deserialize(&mut json)
            .map_err(|e| field(e.path().to_string(), e.inner().to_string()))?
    } else {
        serde_path_to_error::deserialize(words(s)?)
            .map_err(|e| field(e.path().to_string(), e.inner().to_string()))?
    };
    if !(1..=LoaderState::VERSION).contains(&saved.version) {
        return Err(format!(
            "version {}: this build reads versions 1 to {}",
            saved.version,
            LoaderState::VERSION
        ));
    }
    if let Some(f) = &saved.fingerprint
        && (f.len() != FINGERPRINT_DIGITS || !f.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(format!(
            "fingerprint {}: expected {FINGERPRINT_DIGITS} hex digits",
            stdx::Quoted(f)
        ));
    }
    let remaining = match &saved.remaining {
        None => None,
        Some(r) => remaining_from(r)?,
    };
    Ok(LoaderState {
        epoch: saved.epoch,
        batch: saved.batch,
        seed: saved.seed,
        rank: saved.rank,
        world_size: saved.world_size,
        batch_size: saved.batch_size,
        dataset_len: saved.dataset_len,
        remaining,
        contents: saved.contents,
        fingerprint: saved.fingerprint,
    })
}

/// `why` cut to a bounded length (twice what a quote shows: a reason may quote a value and name it).
fn clipped(why: String) -> String {
    match why.char_indices().nth(2 * stdx::QUOTE_CHARS) {
        None => why,
        Some((cut, _)) => format!("{}… (cut)", &why[..cut]),
    }
}

impl std::str::FromStr for LoaderState {
    type Err = Error;
    /// See [`read`]; the refusal quotes the text (bounded: a state file may be any file).
    fn from_str(s: &str) -> Result<Self> {
        read(s).map_err(|why| Error::Resume(format!("unreadable state {}: {why}", stdx::Quoted(s))))
    }
}

#[cfg(test)]
mod state_tests {
    use super::*;

    fn state() -> LoaderState {
        LoaderState {
            epoch: 3,
            batch: 17,
            seed: u64::MAX,
            rank: 1,
            world_size: 4,
            batch_size: 64,
            dataset_len: 5000,
            remaining: Some(vec![3..9, 12..4000]),
            contents: Some(LoaderState::contents_of(&LoaderOptions::default())),
            fingerprint: Some("0123456789abcdef0123456789abcdef".into()),
        }
    }

    #[test]
    fn a_state_round_trips_as_one_line_of_json() {
        let st = state();
        let text = st.to_string();
        assert!(
            text.starts_with("{\"epoch\":3,\"batch\":17,\"seed\":18446744073709551615,"),
            "{text}"
        );
        assert!(
            text.contains("\"remaining\":\"3:9,12:4000\",\"contents\":\"crop:"),
            "{text}"
        );
        assert!(
            text.ends_with(",\"fingerprint\":\"0123456789abcdef0123456789abcdef\",\"version\":3}")
                && !text.contains('\n'),
            "{text}"
        );
        assert_eq!(text.parse::<LoaderState>().unwrap(), st);
        let whole = LoaderState {
            remaining: None,
            contents: None,
            fingerprint: None,
            ..st
        };
        assert_eq!(whole.to_string().parse::<LoaderState>().unwrap(), whole);
    }

    /// A partial, damaged or mistyped state is refused, naming the field (JSON and words alike).
    #[test]
    fn a_partial_or_mistyped_state_is_refused_naming_the_field() {
        let json = state().to_string();
        let words = "epoch=3 batch=17 seed=1 rank=0 world_size=4 batch_size=64 dataset_len=5000";
        for (input, says) in [
            (
                json.replace("\"seed\":18446744073709551615,", ""),
                "missing field `seed`",
            ),
            (
                json.replace("\"batch\":17", "\"batch\":\"17\""),
                "batch: invalid type",
            ),
            (
                json.replace("\"rank\":1", "\"rank\":-1"),
                "rank: invalid value",
            ),
            (
                json.replace("\"epoch\":3", "\"epoch\":3,\"step\":1"),
                "unknown field `step`",
            ),
            (json.replace("\"version\":3", "\"version\":4"), "version 4"),
            (
                json.replace("0123456789abcdef0123456789abcdef", "xyz"),
                "fingerprint \"xyz\": expected 32 hex digits",
            ),
            (
                json.replace("\"rank\":1", "\"rank\":\"x\""),
                "rank: invalid type: string \"x\"",
            ),
            (
                json.replace("\"rank\":1", "\"rank\":null"),
                "rank: invalid type: null",
            ),
            (
                json.replace("\"rank\":1", "\"rank\":[1]"),
                "rank: invalid type: sequence",
            ),
            (
                json.replace("\"3:9,12:4000\"", "7"),
                "remaining: invalid type: integer `7`",
            ),
            (json.replace("3:9,12:4000", "5:3"), "remaining=\"5:3\""),
            (
                json.replace("3:9,12:4000", "1:4,2:6"),
                "remaining=\"1:4,2:6\"",
            ),
            (json[..json.len() - 9].to_string(), "EOF"),
            ("epoch=3 batch=17".to_string(), "missing field `seed`"),
            (String::new(), "missing field `epoch`"),
            (format!("{words} batch=2"), "\"batch\" given twice"),
            (
                words.replace("epoch=3", "epoch=x"),
                "epoch: invalid type: string \"x\"",
            ),
            ("epoch".to_string(), "not name=value"),
            (format!("{words} step=1"), "unknown field `step`"),
            (format!("{words} remaining=x"), "remaining=\"x\""),
            (format!("{words} version=4"), "version 4"),
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

    /// However long the text (a state file that is really some other file), the refusal quotes a
    /// bounded part of it, and so does a mistyped field's reason.
    #[test]
    fn a_refusal_quotes_a_bounded_part_of_the_text() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n".repeat(5000);
        let e = passwd.parse::<LoaderState>().unwrap_err().to_string();
        assert!(e.len() < 1000, "{} bytes: {e}", e.len());
        assert!(e.contains("more characters)"), "{e}");
        let long = "x".repeat(100_000);
        let json = state()
            .to_string()
            .replace("\"rank\":1", &format!("\"rank\":\"{long}\""));
        let e = json.parse::<LoaderState>().unwrap_err().to_string();
        assert!(e.len() < 2000 && e.contains("rank: invalid type"), "{e}");
        let e = LoaderState::from_json_fields(&json)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot resume: rank: invalid type"), "{e}");
        assert_eq!(e.matches("cannot resume").count(), 1, "{e}");
        let e = format!("{} step=1", "epoch=1 ".repeat(10)).parse::<LoaderState>();
        assert!(e.unwrap_err().to_string().len() < 1000);
    }
}
