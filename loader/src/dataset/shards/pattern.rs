//! Shard set locations as WebDataset spells them: `DIR/train-{000000..000099}.tar` (brace ranges, zero
//! padded to the width written, and `{a,b}` lists), one `x.tar`, or a folder or prefix holding `*.tar`
//! files — local or `s3://bucket/prefix/...`.

/// Whether `location` names shards by itself (a brace pattern or a `.tar` file), rather than a folder
/// whose listing may hold them.
pub fn names_shards(location: &str) -> bool {
    let file = location.rsplit('/').next().unwrap_or(location);
    file.contains('{') || file.ends_with(".tar")
}

/// `location` split into the folder (or prefix) the shards are in and their file names, braces
/// expanded. The folder part may not hold braces.
pub fn split(location: &str) -> Result<(String, Vec<String>), String> {
    let (dir, file) = match location.rfind('/') {
        Some(i) => (&location[..i], &location[i + 1..]),
        None => (".", location),
    };
    if dir.contains(['{', '}']) {
        return Err("braces in the folder part: only the shard file names may be a pattern".into());
    }
    let dir = if dir.is_empty() { "/" } else { dir };
    let names = expand(file)?;
    if let Some(bad) = names.iter().find(|n| !n.ends_with(".tar")) {
        return Err(format!("{bad} is not a .tar file name"));
    }
    Ok((dir.to_string(), names))
}

/// Largest number of names one pattern may expand to.
const MAX_NAMES: usize = 1_000_000;

/// Every name `pattern` stands for, in order: each `{A..B}` (decimal, `A <= B`; zero-padded to `A`'s
/// width when `A` starts with 0 or both are written at one width) and each `{x,y}` list multiplies the
/// names, left to right.
pub fn expand(pattern: &str) -> Result<Vec<String>, String> {
    let mut names = vec![String::new()];
    let mut rest = pattern;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err(format!("{pattern}: a `}}` without its `{{`"));
        }
        let close = rest[open..]
            .find('}')
            .map(|c| open + c)
            .ok_or_else(|| format!("{pattern}: a `{{` without its `}}`"))?;
        let inner = &rest[open + 1..close];
        if inner.contains('{') {
            return Err(format!("{pattern}: nested braces"));
        }
        let choices = alternatives(inner).map_err(|e| format!("{pattern}: {e}"))?;
        if names.len().saturating_mul(choices.len()) > MAX_NAMES {
            return Err(format!("{pattern}: over {MAX_NAMES} names"));
        }
        let literal = &rest[..open];
        names = names
            .iter()
            .flat_map(|n| choices.iter().map(move |c| format!("{n}{literal}{c}")))
            .collect();
        rest = &rest[close + 1..];
    }
    for n in &mut names {
        n.push_str(rest);
    }
    Ok(names)
}

fn alternatives(inner: &str) -> Result<Vec<String>, String> {
    if let Some((a, b)) = inner.split_once("..") {
        let num = |s: &str| {
            s.parse::<u64>()
                .ok()
                .filter(|_| s.bytes().all(|c| c.is_ascii_digit()))
                .ok_or_else(|| format!("{{{inner}}}: a range of decimal numbers, {{A..B}}"))
        };
        let (lo, hi) = (num(a)?, num(b)?);
        if lo > hi {
            return Err(format!("{{{inner}}}: the range runs backwards"));
        }
        if hi - lo >= MAX_NAMES as u64 {
            return Err(format!("{{{inner}}}: over {MAX_NAMES} names"));
        }
        let width = if a.starts_with('0') || a.len() == b.len() {
            a.len()
        } else {
            0
        };
        return Ok((lo..=hi).map(|n| format!("{n:0width$}")).collect());
    }
    Ok(inner.split(',').map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_lists_expand_as_webdataset_does() {
        assert_eq!(
            expand("train-{000000..000002}.tar").unwrap(),
            ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
        );
        assert_eq!(expand("{a,b}-{8..10}.tar").unwrap().len(), 6);
        assert_eq!(expand("{a,b}-{8..10}.tar").unwrap()[2], "a-10.tar");
        assert_eq!(expand("plain.tar").unwrap(), ["plain.tar"]);
        for bad in [
            "x-{1..}.tar",
            "x-{3..1}.tar",
            "x-{1..2.tar",
            "x-1}.tar",
            "{a{b}}.tar",
        ] {
            assert!(expand(bad).is_err(), "{bad}");
        }
        assert_eq!(
            split("s3://b/p/s-{0..1}.tar").unwrap(),
            (
                "s3://b/p".to_string(),
                vec!["s-0.tar".to_string(), "s-1.tar".to_string()]
            )
        );
        assert!(split("d{1,2}/s.tar").is_err());
        assert!(split("d/s-{0..1}.zip").is_err());
        assert!(names_shards("d/s-{0..1}.tar") && names_shards("a.tar") && !names_shards("d"));
    }
}
