//! MoE routing and experts (spec §4.5): TopK, MoeWeights, MoeExperts.

use super::common::{
    act_f32, act_format, act_i32, out_f32, out_i32, silu, topk_before, weight, MOE_MIN_WEIGHT_SUM,
};
use crate::quant;
use crate::{OpError, Tensor, TensorMeta, Value, WeightView};

/// Indices of the k largest values per row, descending, ties to the lower index.
pub fn topk(ins: &[Value<'_>], out: &TensorMeta, k: usize) -> Result<Tensor, OpError> {
    const OP: &str = "TopK";
    let x = act_f32(OP, &ins[0])?;
    let n = ins[0].act().shape.0[0];
    let rows = out.shape.rows();
    let mut y = Vec::with_capacity(k * rows);
    let mut idx: Vec<usize> = Vec::with_capacity(n);
    for r in 0..rows {
        let xr = &x[r * n..(r + 1) * n];
        idx.clear();
        idx.extend(0..n);
        idx.sort_by(|&a, &b| topk_before((xr[a], a), (xr[b], b)));
        y.extend(idx[..k].iter().map(|&i| i as i32));
    }
    out_i32(OP, out, y)
}

/// w[r,t] = probs[ids[r,t], t], optionally divided by max(Σ_r w, 6.103515625e-5).
pub fn moe_weights(
    ins: &[Value<'_>],
    out: &TensorMeta,
    normalize: bool,
) -> Result<Tensor, OpError> {
    const OP: &str = "MoeWeights";
    let p = act_f32(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let e = ins[0].act().shape.0[0];
    let k = out.shape.0[0];
    let t = out.shape.rows();
    if p.len() < e * t {
        return Err(OpError::Invalid {
            op: OP,
            msg: format!("probs hold {} values for {t} tokens of {e}", p.len()),
        });
    }
    let mut y = vec![0.0f32; k * t];
    for ti in 0..t {
        for r in 0..k {
            let id = ids[ti * k + r];
            if id < 0 || id as usize >= e {
                return Err(OpError::Invalid {
                    op: OP,
                    msg: format!("expert id {id} out of range ({e} experts)"),
                });
            }
            y[ti * k + r] = p[ti * e + id as usize];
        }
        if normalize {
            let row = &mut y[ti * k..(ti + 1) * k];
            let mut sum = 0.0f32;
            for &w in row.iter() {
                sum += w;
            }
            let den = sum.max(MOE_MIN_WEIGHT_SUM);
            for w in row.iter_mut() {
                *w /= den;
            }
        }
    }
    out_f32(OP, out, y)
}

/// The expert matrices of one MoeExperts call: gate/up rows of expert e and down.
pub struct ExpertSet<'a> {
    pub gate: WeightView<'a>,
    pub up: WeightView<'a>,
    pub down: WeightView<'a>,
    pub merged: bool,
    /// K (model dim), F (expert hidden dim), E (number of experts).
    pub k: usize,
    pub f: usize,
    pub e: usize,
}

impl<'a> ExpertSet<'a> {
    pub fn new(
        op: &'static str,
        ins: &[Value<'a>],
        merged: bool,
    ) -> Result<ExpertSet<'a>, OpError> {
        let gate = weight(op, &ins[3])?;
        let up = if merged { gate } else { weight(op, &ins[4])? };
        let down = weight(op, &ins[if merged { 4 } else { 5 }])?;
        let [f, k, e, _] = down.shape.0;
        Ok(ExpertSet {
            gate,
            up,
            down,
            merged,
            k,
            f,
            e,
        })
    }
    /// Gate row `i` (0..F) of expert `e`.
    pub fn gate_row(&self, e: usize, i: usize) -> &'a [u8] {
        self.gate.expert(e).row(i)
    }
    /// Up row `i` (0..F) of expert `e` (rows F..2F of the merged tensor).
    pub fn up_row(&self, e: usize, i: usize) -> &'a [u8] {
        if self.merged {
            self.up.expert(e).row(self.f + i)
        } else {
            self.up.expert(e).row(i)
        }
    }
    /// Down row `i` (0..K) of expert `e`.
    pub fn down_row(&self, e: usize, i: usize) -> &'a [u8] {
        self.down.expert(e).row(i)
    }
    /// Check an expert id.
    pub fn check_id(&self, op: &'static str, id: i32) -> Result<usize, OpError> {
        if id < 0 || id as usize >= self.e {
            return Err(OpError::Invalid {
                op,
                msg: format!("expert id {id} out of range ({} experts)", self.e),
            });
        }
        Ok(id as usize)
    }
}

/// out_t = Σ_r (in selection order) w[r,t] · down_e(silu(gate_e x_t) ⊙ up_e x_t).
pub fn moe_experts(ins: &[Value<'_>], out: &TensorMeta, merged: bool) -> Result<Tensor, OpError> {
    const OP: &str = "MoeExperts";
    let x = act_f32(OP, &ins[0])?;
    let ids = act_i32(OP, &ins[1])?;
    let wts = act_f32(OP, &ins[2])?;
    let ex = ExpertSet::new(OP, ins, merged)?;
    let (kd, f) = (ex.k, ex.f);
    let top = ins[1].act().shape.0[0];
    let t = out.shape.0[1];
    let (gt, grb) = act_format(OP, ex.gate.ty, kd)?;
    let (ut, urb) = act_format(OP, ex.up.ty, kd)?;
    let (dt, drb) = act_format(OP, ex.down.ty, f)?;
    let mut xg = vec![0u8; grb];
    let mut xu = vec![0u8; urb];
    let mut hq = vec![0u8; drb];
    let mut hid = vec![0.0f32; f];
    let mut y = vec![0.0f32; kd * t];
    for ti in 0..t {
        let xt = &x[ti * kd..(ti + 1) * kd];
        quant::quantize_row(gt, xt, &mut xg);
        quant::quantize_row(ut, xt, &mut xu);
        let acc = &mut y[ti * kd..(ti + 1) * kd];
        for r in 0..top {
            let e = ex.check_id(OP, ids[ti * top + r])?;
            let w = wts[ti * top + r];
            for i in 0..f {
                let g = quant::vec_dot(ex.gate.ty, kd, ex.gate_row(e, i), &xg);
                let u = quant::vec_dot(ex.up.ty, kd, ex.up_row(e, i), &xu);
                hid[i] = silu(g) * u;
            }
            quant::quantize_row(dt, &hid, &mut hq);
            for i in 0..kd {
                let o = quant::vec_dot(ex.down.ty, f, ex.down_row(e, i), &hq) * w;
                acc[i] += o;
            }
        }
    }
    out_f32(OP, out, y)
}
