//! Placement requests: explicit > environment > defaults, aliases, clamping, errors.

use pn_engine::planner::{Device, DeviceKind, Placement, PlacementError, Source};
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

fn resolve(
    dies: Option<&str>,
    split: Option<usize>,
    e: &[(&str, &str)],
) -> Result<Placement, PlacementError> {
    Placement::resolve_with(dies, split, &env(e))
}

#[test]
fn devices_parse_and_print() {
    assert_eq!("cpu:1".parse::<Device>().unwrap(), Device::cpu(1));
    assert_eq!("cpu".parse::<Device>().unwrap(), Device::cpu(0));
    assert_eq!("2".parse::<Device>().unwrap(), Device::cpu(2));
    assert_eq!(
        "cuda:1".parse::<Device>().unwrap(),
        Device {
            kind: DeviceKind::Cuda,
            index: 1
        }
    );
    assert_eq!(Device::cuda(3).to_string(), "cuda:3");
    for bad in ["tpu:0", "cpu:x", "", "cpu:-1"] {
        let e = bad.parse::<Device>().unwrap_err();
        assert!(matches!(e, PlacementError::BadDevice { .. }), "{bad}: {e}");
        assert!(e.to_string().contains("expected cpu:N or cuda:N"), "{e}");
    }
}

#[test]
fn defaults_are_one_die() {
    let p = resolve(None, None, &[]).unwrap();
    assert_eq!(p.named_dies(), vec![Device::cpu(0)]);
    assert_eq!(p.split_layer(4), 4);
    assert_eq!(p.dies(4), vec![Device::cpu(0)]);
    assert_eq!(
        (p.dies_source, p.split_source),
        (Source::Default, Source::Default)
    );
}

#[test]
fn two_dies_without_split_split_in_half() {
    let p = resolve(Some("cpu:0,cpu:1"), None, &[]).unwrap();
    assert_eq!(p.split_layer(4), 2);
    assert_eq!(p.split_layer(5), 2);
    assert_eq!(p.split_layer(1), 1, "at least one layer on die A");
    assert_eq!(p.dies(4), vec![Device::cpu(0), Device::cpu(1)]);
    assert_eq!(
        p.dies(1),
        vec![Device::cpu(0)],
        "split at n_layer is one die"
    );
}

#[test]
fn split_is_clamped_and_n_layer_means_one_die() {
    let p = Placement::split(Device::cpu(0), Device::cpu(1), 9);
    assert_eq!(p.split_layer(4), 4);
    assert_eq!(p.dies(4), vec![Device::cpu(0)]);
    let p = Placement::split(Device::cpu(0), Device::cpu(1), 3);
    assert_eq!(p.split_layer(4), 3);
    assert_eq!(p.dies(4).len(), 2);
}

#[test]
fn explicit_beats_env_beats_default() {
    let e = [
        ("PN_SPLIT_LAYER", "1"),
        ("PN_DIE_A", "cpu:2"),
        ("PN_DIE_B", "cpu:3"),
    ];
    let p = resolve(None, None, &e).unwrap();
    assert_eq!(
        (p.die_a, p.die_b, p.split),
        (Device::cpu(2), Some(Device::cpu(3)), Some(1))
    );
    assert_eq!((p.dies_source, p.split_source), (Source::Env, Source::Env));
    let p = resolve(Some("cpu:0,cpu:1"), Some(3), &e).unwrap();
    assert_eq!(
        (p.die_a, p.die_b, p.split),
        (Device::cpu(0), Some(Device::cpu(1)), Some(3))
    );
    assert_eq!(
        (p.dies_source, p.split_source),
        (Source::Explicit, Source::Explicit)
    );
    // per field: explicit dies, split from the environment
    let p = resolve(Some("cpu:0,cpu:1"), None, &e).unwrap();
    assert_eq!((p.split, p.split_source), (Some(1), Source::Env));
}

#[test]
fn seed_aliases_are_accepted_and_pn_names_win() {
    let p = resolve(
        None,
        None,
        &[
            ("QWEN35_GPU_SPLIT_LAYER", "2"),
            ("QWEN35_GPU_DIE_A", "0"),
            ("QWEN35_GPU_DIE_B", "1"),
        ],
    )
    .unwrap();
    assert_eq!(
        (p.die_a, p.die_b, p.split),
        (Device::cpu(0), Some(Device::cpu(1)), Some(2))
    );
    let p = resolve(
        None,
        None,
        &[("QWEN35_GPU_SPLIT_LAYER", "2"), ("PN_SPLIT_LAYER", "3")],
    )
    .unwrap();
    assert_eq!(p.split, Some(3));
}

#[test]
fn env_split_alone_adds_the_next_die() {
    let p = resolve(None, None, &[("PN_SPLIT_LAYER", "2")]).unwrap();
    assert_eq!(p.named_dies(), vec![Device::cpu(0), Device::cpu(1)]);
    let p = resolve(None, Some(2), &[("PN_DIE_A", "cpu:4")]).unwrap();
    assert_eq!(p.named_dies(), vec![Device::cpu(4), Device::cpu(5)]);
}

#[test]
fn explicit_single_die_ignores_env_split_and_rejects_explicit_split() {
    let p = resolve(Some("cpu:0"), None, &[("PN_SPLIT_LAYER", "2")]).unwrap();
    assert_eq!(p.named_dies(), vec![Device::cpu(0)]);
    assert_eq!(p.split_layer(4), 4);
    let e = resolve(Some("cpu:0"), Some(2), &[]).unwrap_err();
    assert!(
        matches!(e, PlacementError::SplitNeedsTwoDies { split: 2, .. }),
        "{e}"
    );
}

#[test]
fn invalid_values_are_typed_errors() {
    let e = resolve(None, Some(0), &[]).unwrap_err();
    assert_eq!(e, PlacementError::SplitZero);
    assert!(
        e.to_string().contains("expected a value in 1..=n_layer")
            && e.to_string().contains("found 0"),
        "{e}"
    );
    let e = resolve(None, None, &[("PN_SPLIT_LAYER", "0")]).unwrap_err();
    assert_eq!(e, PlacementError::SplitZero);
    let e = resolve(None, None, &[("PN_SPLIT_LAYER", "two")]).unwrap_err();
    assert!(
        matches!(&e, PlacementError::BadSplit { var, found } if var == "PN_SPLIT_LAYER" && found == "two"),
        "{e}"
    );
    let e = resolve(Some("cpu:0,cpu:0"), None, &[]).unwrap_err();
    assert_eq!(e, PlacementError::SameDie("cpu:0".into()));
    assert!(
        e.to_string()
            .contains("expected two different dies, found cpu:0 twice"),
        "{e}"
    );
    let e = resolve(None, None, &[("PN_DIE_A", "cpu:1"), ("PN_DIE_B", "cpu:1")]).unwrap_err();
    assert_eq!(e, PlacementError::SameDie("cpu:1".into()));
    let e = resolve(Some("npu:0"), None, &[]).unwrap_err();
    assert!(matches!(e, PlacementError::BadDevice { .. }), "{e}");
    let e = resolve(Some("cpu:0,cpu:1,cpu:2"), None, &[]).unwrap_err();
    assert_eq!(e, PlacementError::TooManyDies(3));
    let e = Placement::single(Device::cpu(0))
        .with_override("attn_norm-0", 1)
        .check()
        .unwrap_err();
    assert!(
        matches!(e, PlacementError::BadOverride { die: 1, .. }),
        "{e}"
    );
    // cuda parses; whether it exists is the backend factory's business
    let p = resolve(Some("cuda:0,cuda:1"), Some(2), &[]).unwrap();
    assert_eq!(p.die_a.kind, DeviceKind::Cuda);
}
