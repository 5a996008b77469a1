//! Reference RoPE: identity at position 0, untouched tail dims, the iterative f32 theta,
//! NEOX pairing, IMRope sections.

use pn_ops::reference::common::meta_of;
use pn_ops::reference::execute;
use pn_ops::*;

fn run(op: &Op, ins: &[Value<'_>]) -> Result<Tensor, OpError> {
    let metas: Vec<TensorMeta> = ins.iter().map(meta_of).collect();
    let out = op.infer(&metas)?;
    execute(op, ins, &out, None)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    pn_ops::testing::uniform(n, seed, 1)
}

fn rope(mode: RopeMode, n_rot: usize, base: f32, scale: f32, x: &Tensor, pos: &[i32]) -> Vec<f32> {
    let p = Tensor::i32(Shape::d1(pos.len()), pos.to_vec());
    run(
        &Op::Rope {
            n_rot,
            mode,
            freq_base: base,
            freq_scale: scale,
        },
        &[Value::Act(x), Value::Act(&p)],
    )
    .unwrap()
    .into_f32()
}

const IMROPE: RopeMode = RopeMode::IMRope {
    sections: [11, 11, 10, 0],
};

#[test]
fn position_zero_is_identity() {
    let (d, h) = (80, 3);
    let x = Tensor::f32(Shape::d3(d, h, 1), data(d * h, 1));
    for mode in [RopeMode::Neox, IMROPE] {
        assert_eq!(rope(mode, 64, 1e7, 1.0, &x, &[0]), x.as_f32());
    }
}

#[test]
fn dims_beyond_n_rot_unchanged_and_norm_preserved() {
    let (d, h, t) = (80, 2, 3);
    let xs = data(d * h * t, 2);
    let x = Tensor::f32(Shape::d3(d, h, t), xs.clone());
    let y = rope(RopeMode::Neox, 64, 1e4, 1.0, &x, &[5, 17, 1000]);
    for row in 0..h * t {
        assert_eq!(
            &y[row * d + 64..(row + 1) * d],
            &xs[row * d + 64..(row + 1) * d]
        );
        for i in 0..32 {
            let (a, b) = (xs[row * d + i], xs[row * d + i + 32]);
            let (c, e) = (y[row * d + i], y[row * d + i + 32]);
            assert!(((a * a + b * b) - (c * c + e * e)).abs() < 1e-5);
        }
    }
}

#[test]
fn matches_closed_form_neox_pairs() {
    let (d, n_rot, p) = (16usize, 12usize, 3i32);
    let xs = data(d, 3);
    let x = Tensor::f32(Shape::d3(d, 1, 1), xs.clone());
    let y = rope(RopeMode::Neox, n_rot, 10000.0, 1.0, &x, &[p]);
    let half = n_rot / 2;
    for i in 0..half {
        let theta = p as f64 * 10000f64.powf(-2.0 * i as f64 / n_rot as f64);
        let (a, b) = (xs[i] as f64, xs[i + half] as f64);
        let want0 = a * theta.cos() - b * theta.sin();
        let want1 = a * theta.sin() + b * theta.cos();
        assert!((y[i] as f64 - want0).abs() < 1e-5, "pair {i}");
        assert!((y[i + half] as f64 - want1).abs() < 1e-5, "pair {i}");
    }
}

#[test]
fn theta_is_the_iterative_f32_product() {
    // At a large position the iterative product differs from pow(); the kernel must use it.
    let (d, n_rot, p, base) = (8usize, 8usize, 100_000i32, 1e7f32);
    let xs = data(d, 4);
    let x = Tensor::f32(Shape::d3(d, 1, 1), xs.clone());
    let y = rope(RopeMode::Neox, n_rot, base, 1.0, &x, &[p]);
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = p as f32;
    for i in 0..n_rot / 2 {
        let (c, s) = (theta.cos(), theta.sin());
        let (a, b) = (xs[i], xs[i + n_rot / 2]);
        assert_eq!(y[i], a * c - b * s);
        assert_eq!(y[i + n_rot / 2], a * s + b * c);
        theta *= theta_scale;
    }
}

#[test]
fn freq_scale_scales_the_angle() {
    // theta(p=2, scale 0.5) == theta(p=1, scale 1) exactly (power-of-two scalings).
    let x = Tensor::f32(Shape::d3(32, 2, 1), data(64, 5));
    assert_eq!(
        rope(RopeMode::Neox, 32, 1e6, 0.5, &x, &[2]),
        rope(RopeMode::Neox, 32, 1e6, 1.0, &x, &[1])
    );
}

#[test]
fn imrope_text_equals_neox() {
    let (d, h, t) = (256, 2, 4);
    let x = Tensor::f32(Shape::d3(d, h, t), data(d * h * t, 6));
    let pos = [0, 1, 77, 4095];
    assert_eq!(
        rope(IMROPE, 64, 1e7, 1.0, &x, &pos),
        rope(RopeMode::Neox, 64, 1e7, 1.0, &x, &pos)
    );
}

#[test]
fn imrope_extra_section_uses_position_zero() {
    // sections [1,1,1,1]: sector 3 of every 4 pairs takes e = 0 (identity rotation).
    let (d, n_rot) = (16usize, 16usize);
    let xs = data(d, 7);
    let x = Tensor::f32(Shape::d3(d, 1, 1), xs.clone());
    let y = rope(
        RopeMode::IMRope {
            sections: [1, 1, 1, 1],
        },
        n_rot,
        1e4,
        1.0,
        &x,
        &[9],
    );
    let yn = rope(RopeMode::Neox, n_rot, 1e4, 1.0, &x, &[9]);
    for i in 0..n_rot / 2 {
        if i % 4 == 3 {
            assert_eq!(
                (y[i], y[i + 8]),
                (xs[i], xs[i + 8]),
                "pair {i} must be unrotated"
            );
        } else {
            assert_eq!((y[i], y[i + 8]), (yn[i], yn[i + 8]), "pair {i} uses p");
        }
    }
    // Zero sections are rejected, not a division by zero.
    let p = Tensor::i32(Shape::d1(1), vec![1]);
    let op = Op::Rope {
        n_rot,
        mode: RopeMode::IMRope { sections: [0; 4] },
        freq_base: 1e4,
        freq_scale: 1.0,
    };
    assert!(run(&op, &[Value::Act(&x), Value::Act(&p)]).is_err());
}

fn rope_ff(mode: RopeMode, n_rot: usize, x: &Tensor, pos: &[i32], ff: &[f32]) -> Vec<f32> {
    let p = Tensor::i32(Shape::d1(pos.len()), pos.to_vec());
    let f = Tensor::f32(Shape::d1(ff.len()), ff.to_vec());
    let op = Op::Rope { n_rot, mode, freq_base: 5e5, freq_scale: 1.0 };
    run(&op, &[Value::Act(x), Value::Act(&p), Value::Act(&f)]).unwrap().into_f32()
}

#[test]
fn normal_mode_rotates_adjacent_pairs_with_freq_factors() {
    // closed form in f64: pair i = (2i, 2i+1), θ_i = p · base^(−2i/n) / ff_i
    let (d, n_rot, p) = (48, 32, 77);
    let xs = data(d, 21);
    let x = Tensor::f32(Shape::d3(d, 1, 1), xs.clone());
    let ff: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + (i % 5) as f32 * 1.5).collect();
    for (y, ff) in [(rope_ff(RopeMode::Normal, n_rot, &x, &[p], &ff), ff.clone()), (rope(RopeMode::Normal, n_rot, 5e5, 1.0, &x, &[p]), vec![1.0; n_rot / 2])] {
        for i in 0..n_rot / 2 {
            let th = p as f64 * 5e5f64.powf(-2.0 * i as f64 / n_rot as f64) / ff[i] as f64;
            let (a, b) = (xs[2 * i] as f64, xs[2 * i + 1] as f64);
            assert!((y[2 * i] as f64 - (a * th.cos() - b * th.sin())).abs() < 2e-3, "pair {i}");
            assert!((y[2 * i + 1] as f64 - (a * th.sin() + b * th.cos())).abs() < 2e-3, "pair {i}");
        }
        assert_eq!(&y[n_rot..], &xs[n_rot..]);
    }
    // factors of 1 change nothing, in either pairing
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        assert_eq!(rope_ff(mode, n_rot, &x, &[p], &[1.0; 16]), rope(mode, n_rot, 5e5, 1.0, &x, &[p]));
    }
}

#[test]
fn freq_factors_of_the_wrong_length_are_rejected() {
    let x = Tensor::f32(Shape::d3(32, 1, 1), data(32, 3));
    let p = Tensor::i32(Shape::d1(1), vec![1]);
    let f = Tensor::f32(Shape::d1(8), vec![1.0; 8]);
    let op = Op::Rope { n_rot: 32, mode: RopeMode::Normal, freq_base: 1e4, freq_scale: 1.0 };
    let e = run(&op, &[Value::Act(&x), Value::Act(&p), Value::Act(&f)]).unwrap_err();
    assert!(e.to_string().contains("freq factors"), "{e}");
}
