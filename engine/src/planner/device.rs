//! Devices ("dies") and the placement request: which dies, where the layers split, and
//! per-node overrides, resolved as explicit (API / CLI) > environment > defaults.

use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// The kind of executor a die is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

/// A die: `cpu:N` (its own CPU backend instance and thread pool) or `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    pub kind: DeviceKind,
    pub index: usize,
}

impl Device {
    pub fn cpu(index: usize) -> Device {
        Device {
            kind: DeviceKind::Cpu,
            index,
        }
    }
    pub fn cuda(index: usize) -> Device {
        Device {
            kind: DeviceKind::Cuda,
            index,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = match self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        };
        write!(f, "{k}:{}", self.index)
    }
}

impl FromStr for Device {
    type Err = PlacementError;
    /// `cpu:N`, `cuda:N`, `cpu` / `cuda` (index 0), or a bare index `N` (= `cpu:N`, the
    /// default kind of this build; the seed's `QWEN35_GPU_DIE_A=1` style).
    fn from_str(s: &str) -> Result<Device, PlacementError> {
        let t = s.trim();
        let bad = || PlacementError::BadDevice {
            found: s.to_string(),
        };
        let (kind, idx) = match t.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None if t.chars().all(|c| c.is_ascii_digit()) && !t.is_empty() => ("cpu", Some(t)),
            None => (t, None),
        };
        let kind = match kind.to_ascii_lowercase().as_str() {
            "cpu" => DeviceKind::Cpu,
            "cuda" | "gpu" => DeviceKind::Cuda,
            _ => return Err(bad()),
        };
        let index = match idx {
            Some(i) => i.trim().parse::<usize>().map_err(|_| bad())?,
            None => 0,
        };
        Ok(Device { kind, index })
    }
}

/// Where a placement decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The API (`Placement::split`, overrides) or a CLI flag.
    Explicit,
    /// `PN_SPLIT_LAYER` / `PN_DIE_A` / `PN_DIE_B` (or their `QWEN35_GPU_*` aliases).
    Env,
    Default,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlacementError {
    #[error("device: expected cpu:N or cuda:N, found {found:?}")]
    BadDevice { found: String },
    #[error("{var}: expected a layer index in 1..=n_layer, found {found:?}")]
    BadSplit { var: String, found: String },
    #[error("split layer: expected a value in 1..=n_layer (layers [0, split) on die A), found 0")]
    SplitZero,
    #[error("dies: expected two different dies, found {0} twice (two dies on one GPU: --dies cuda:0,cuda:1 with PN_CUDA_DEVICE_MAP=0,0)")]
    SameDie(String),
    #[error("dies: expected one or two dies (die A, die B), found {0}")]
    TooManyDies(usize),
    #[error("device {device} is not available in this build: {reason}")]
    NotAvailable { device: String, reason: String },
    #[error("split layer {split}: expected two dies, found one ({die}); pass --dies A,B")]
    SplitNeedsTwoDies { split: usize, die: String },
    #[error("override {node:?}: expected die 0 (A) or 1 (B), found {die}")]
    BadOverride { node: String, die: usize },
}

/// A per-node override: nodes named `pattern` (exact, or a prefix when it ends in `*`)
/// run on die `die` (0 = A, 1 = B).
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    pub pattern: String,
    pub die: usize,
}

impl Override {
    pub fn matches(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(p) => name.starts_with(p),
            None => name == self.pattern,
        }
    }
}

/// What the planner is asked to do. `split == None` means "the default": one die →
/// n_layer (everything on A), two dies → n_layer / 2.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub die_a: Device,
    pub die_b: Option<Device>,
    pub split: Option<usize>,
    pub overrides: Vec<Override>,
    /// Where the dies came from.
    pub dies_source: Source,
    /// Where the split came from (the cause recorded for layer nodes).
    pub split_source: Source,
}

impl Default for Placement {
    fn default() -> Placement {
        Placement {
            die_a: Device::cpu(0),
            die_b: None,
            split: None,
            overrides: Vec::new(),
            dies_source: Source::Default,
            split_source: Source::Default,
        }
    }
}

impl Placement {
    /// Everything on one die.
    pub fn single(dev: Device) -> Placement {
        Placement {
            die_a: dev,
            dies_source: Source::Explicit,
            split_source: Source::Explicit,
            ..Placement::default()
        }
    }
    /// Layers [0, split_layer) + embedding on `a`, the rest + output norm + head on `b`.
    pub fn split(a: Device, b: Device, split_layer: usize) -> Placement {
        Placement {
            die_a: a,
            die_b: Some(b),
            split: Some(split_layer),
            dies_source: Source::Explicit,
            split_source: Source::Explicit,
            ..Placement::default()
        }
    }
    /// Two dies, split at the default (n_layer / 2).
    pub fn two(a: Device, b: Device) -> Placement {
        Placement {
            die_a: a,
            die_b: Some(b),
            dies_source: Source::Explicit,
            ..Placement::default()
        }
    }
    /// Adds a per-node override (`pattern`: node name, or prefix ending in `*`).
    pub fn with_override(mut self, pattern: impl Into<String>, die: usize) -> Placement {
        self.overrides.push(Override {
            pattern: pattern.into(),
            die,
        });
        self
    }

    /// Resolves CLI-style values (`dies`: "cpu:0,cpu:1", `split`) against the process
    /// environment; see [`Placement::resolve_with`].
    pub fn resolve(dies: Option<&str>, split: Option<usize>) -> Result<Placement, PlacementError> {
        Placement::resolve_with(dies, split, &|k| std::env::var(k).ok())
    }

    /// Explicit values beat the environment (`PN_DIE_A`, `PN_DIE_B`, `PN_SPLIT_LAYER`,
    /// aliases `QWEN35_GPU_DIE_A`, `QWEN35_GPU_DIE_B`, `QWEN35_GPU_SPLIT_LAYER`), which
    /// beats the defaults (one die `cpu:0`). A split with a single die A that was not
    /// given explicitly takes die B = the next index of die A's kind; an explicit single
    /// die ignores an environment split and rejects an explicit one.
    pub fn resolve_with(
        dies: Option<&str>,
        split: Option<usize>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Placement, PlacementError> {
        let var = |names: [&str; 2]| -> Option<(String, String)> {
            names.iter().find_map(|n| {
                env(n)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (n.to_string(), v))
            })
        };
        let mut p = Placement::default();
        if let Some(list) = dies {
            let devs = list
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(str::parse::<Device>)
                .collect::<Result<Vec<_>, _>>()?;
            match devs.as_slice() {
                [] => {
                    return Err(PlacementError::BadDevice {
                        found: list.to_string(),
                    })
                }
                [a] => p.die_a = *a,
                [a, b] => (p.die_a, p.die_b) = (*a, Some(*b)),
                more => return Err(PlacementError::TooManyDies(more.len())),
            }
            p.dies_source = Source::Explicit;
        } else {
            if let Some((_, v)) = var(["PN_DIE_A", "QWEN35_GPU_DIE_A"]) {
                p.die_a = v.parse()?;
                p.dies_source = Source::Env;
            }
            if let Some((_, v)) = var(["PN_DIE_B", "QWEN35_GPU_DIE_B"]) {
                p.die_b = Some(v.parse()?);
                p.dies_source = Source::Env;
            }
        }
        if let Some(s) = split {
            p.split = Some(s);
            p.split_source = Source::Explicit;
        } else if let Some((name, v)) = var(["PN_SPLIT_LAYER", "QWEN35_GPU_SPLIT_LAYER"]) {
            let s = v
                .trim()
                .parse::<usize>()
                .map_err(|_| PlacementError::BadSplit {
                    var: name,
                    found: v.clone(),
                })?;
            p.split = Some(s);
            p.split_source = Source::Env;
        }
        if p.split == Some(0) {
            return Err(PlacementError::SplitZero);
        }
        if p.die_b.is_none() && p.split.is_some() {
            let explicit_single = p.dies_source == Source::Explicit;
            match (explicit_single, p.split_source) {
                (true, Source::Explicit) => {
                    return Err(PlacementError::SplitNeedsTwoDies {
                        split: p.split.unwrap_or(0),
                        die: p.die_a.to_string(),
                    })
                }
                (true, _) => (p.split, p.split_source) = (None, Source::Default),
                (false, _) => {
                    p.die_b = Some(Device {
                        kind: p.die_a.kind,
                        index: p.die_a.index + 1,
                    })
                }
            }
        }
        p.check()?;
        Ok(p)
    }

    /// The same die twice, split 0 or a bad override are errors.
    pub fn check(&self) -> Result<(), PlacementError> {
        if self.die_b == Some(self.die_a) {
            return Err(PlacementError::SameDie(self.die_a.to_string()));
        }
        if self.split == Some(0) {
            return Err(PlacementError::SplitZero);
        }
        if let Some(o) = self
            .overrides
            .iter()
            .find(|o| o.die > 1 || (o.die == 1 && self.die_b.is_none()))
        {
            return Err(PlacementError::BadOverride {
                node: o.pattern.clone(),
                die: o.die,
            });
        }
        Ok(())
    }

    /// The effective split for a model of `n_layer` layers: clamped to (0, n_layer];
    /// `n_layer` means everything on die A.
    pub fn split_layer(&self, n_layer: usize) -> usize {
        let n = n_layer.max(1);
        match (self.split, self.die_b) {
            (_, None) => n,
            (Some(s), Some(_)) => s.clamp(1, n),
            (None, Some(_)) => (n / 2).max(1),
        }
    }

    /// The dies the plan for `n_layer` layers uses: [A] or [A, B].
    pub fn dies(&self, n_layer: usize) -> Vec<Device> {
        match self.die_b {
            Some(b)
                if self.split_layer(n_layer) < n_layer.max(1)
                    || !self.overrides.iter().all(|o| o.die == 0) =>
            {
                vec![self.die_a, b]
            }
            _ => vec![self.die_a],
        }
    }

    /// All dies named (A, then B if any): what the runner needs a backend for.
    pub fn named_dies(&self) -> Vec<Device> {
        std::iter::once(self.die_a).chain(self.die_b).collect()
    }
}
