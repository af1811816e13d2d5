//! Dependencies point one way: which workspace crate may depend on which (the table below mirrors
//! ARCHITECTURE.md's diagram), and no command-line or application-error crate in a library. Read from
//! `cargo metadata --format-version 1 --no-deps`: the workspace's packages with the dependencies their
//! manifests declare.

use anyhow::Context;
use serde_json::Value;

/// What a crate is, which decides the third-party crates it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A library: no `anyhow`, `indicatif` or `clap` (`clap` only as an optional dependency behind a
    /// feature named `clap`, which only a binary turns on).
    Library,
    /// A program (the `l3` binary, the benchmarks, xtask): anything.
    Binary,
}

/// One row of the table: a workspace package, what it is, and the workspace packages its normal (and
/// build) dependencies may name.
pub struct Rule {
    pub package: &'static str,
    pub role: Role,
    pub may_depend_on: &'static [&'static str],
}

/// The test tools any crate's dev-dependencies may name besides what its normal dependencies may.
pub const TEST_TOOLS: &[&str] = &["s3-loopback", "cuda-sim"];

/// Dev-dependencies against the direction, each with its reason: a crate's tests reading their fixtures
/// through the one reader of that file type, which lives above it.
pub const DEV_UPWARD: &[(&str, &str, &str)] = &[(
    "bsp-tiling",
    "infer-io",
    "the tests' .npy fixtures are read by the toolkit's one .npy reader",
)];

/// Crates a library must not depend on, unless optional behind the feature of the same name (`clap`).
const APPLICATION_ONLY: &[&str] = &["anyhow", "indicatif", "clap"];

const LIBRARIES: &[&str] = &[
    "vocab",
    "stdx",
    "cuda-setup",
    "l3-format",
    "l3-cuda",
    "pcr",
    "liquid-sampler",
    "bsp-tiling",
    "loader",
    "infer-io",
];

/// The workspace's dependency direction (ARCHITECTURE.md's diagram). A package missing here is an error,
/// so that the table stays the whole truth.
pub const TABLE: &[Rule] = &[
    Rule {
        package: "stdx",
        role: Role::Library,
        may_depend_on: &[],
    },
    Rule {
        package: "vocab",
        role: Role::Library,
        may_depend_on: &["stdx"],
    },
    Rule {
        package: "cuda-setup",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx"],
    },
    Rule {
        package: "cuda-sim",
        role: Role::Library,
        may_depend_on: &["stdx"],
    },
    Rule {
        package: "s3-loopback",
        role: Role::Library,
        may_depend_on: &[],
    },
    Rule {
        package: "l3-format",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx"],
    },
    Rule {
        package: "l3-cuda",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx", "cuda-setup", "l3-format"],
    },
    Rule {
        package: "pcr",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx"],
    },
    Rule {
        package: "liquid-sampler",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx"],
    },
    Rule {
        package: "bsp-tiling",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx", "cuda-setup"],
    },
    Rule {
        package: "loader",
        role: Role::Library,
        may_depend_on: &[
            "vocab",
            "stdx",
            "cuda-setup",
            "l3-format",
            "l3-cuda",
            "pcr",
            "liquid-sampler",
        ],
    },
    Rule {
        package: "infer-io",
        role: Role::Library,
        may_depend_on: &["vocab", "stdx", "l3-format", "bsp-tiling", "loader", "pcr"],
    },
    Rule {
        package: "l3-cli",
        role: Role::Binary,
        may_depend_on: LIBRARIES,
    },
    Rule {
        package: "l3toolkit-python",
        role: Role::Library,
        may_depend_on: LIBRARIES,
    },
    Rule {
        package: "xtask",
        role: Role::Binary,
        may_depend_on: &[],
    },
    Rule {
        package: "l3-bench",
        role: Role::Binary,
        may_depend_on: &[
            "vocab",
            "stdx",
            "cuda-setup",
            "l3-format",
            "l3-cuda",
            "pcr",
            "liquid-sampler",
            "bsp-tiling",
            "loader",
            "infer-io",
            "l3-cli",
            "s3-loopback",
            "xtask",
        ],
    },
];

/// Every violation of `table` in `metadata` (the JSON of `cargo metadata --format-version 1`), one line
/// each, naming the package, the dependency and the rule.
pub fn check(metadata: &Value, table: &[Rule]) -> anyhow::Result<Vec<String>> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata: no \"packages\"")?;
    let members: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut out = Vec::new();
    for p in packages {
        let name = p["name"]
            .as_str()
            .context("cargo metadata: a package without a name")?;
        let Some(rule) = table.iter().find(|r| r.package == name) else {
            out.push(format!("{name}: a workspace crate missing from tidy's table (add it to xtask/src/tidy/deps.rs, as in ARCHITECTURE.md)"));
            continue;
        };
        let features = p["features"].as_object();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            let kind = d["kind"].as_str().unwrap_or("normal");
            let optional = d["optional"].as_bool().unwrap_or(false);
            if members.contains(&dep) {
                let allowed = rule.may_depend_on.contains(&dep)
                    || (kind == "dev" && TEST_TOOLS.contains(&dep))
                    || (kind == "dev" && DEV_UPWARD.iter().any(|&(p, d, _)| p == name && d == dep));
                if !allowed {
                    let what = if kind == "dev" {
                        "a dev-dependency on"
                    } else {
                        "depends on"
                    };
                    out.push(format!(
                        "{name} {what} {dep}: not allowed by the dependency direction (tidy's table: {name} may depend on {})",
                        list(rule.may_depend_on)
                    ));
                }
            }
            if rule.role == Role::Library && kind != "dev" && APPLICATION_ONLY.contains(&dep) {
                let behind_feature = dep == "clap"
                    && optional
                    && features.is_some_and(|f| f.contains_key("clap"))
                    && features.is_some_and(|f| {
                        f.iter().all(|(feature, enables)| {
                            feature == "clap"
                                || !enables
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .any(|e| e.as_str() == Some("dep:clap"))
                        })
                    });
                if !behind_feature {
                    out.push(format!(
                        "{name} (a library) depends on {dep}: libraries take no {dep}{}",
                        if dep == "clap" {
                            " except as an optional dependency behind a `clap` feature"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
    }
    Ok(out)
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "no workspace crate".into()
    } else {
        names.join(", ")
    }
}
