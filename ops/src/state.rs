//! Per-sequence, per-layer state that stateful ops read and update.

/// KV cache of one attention layer, f32, layout `[n_head_kv][capacity][head_dim]`.
/// Cell `p` holds the key/value of position `p` (K after RoPE).
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl KvCache {
    pub fn new(n_head_kv: usize, head_dim: usize, capacity: usize) -> KvCache {
        let n = n_head_kv * capacity * head_dim;
        KvCache { n_head_kv, head_dim, capacity, k: vec![0.0; n], v: vec![0.0; n] }
    }
    /// Offset of cell `pos` of KV head `h`.
    pub fn cell(&self, h: usize, pos: usize) -> usize {
        (h * self.capacity + pos) * self.head_dim
    }
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }
}

/// State of one Gated-DeltaNet layer: the causal-conv window and the delta-rule matrices.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState {
    /// `[d_conv - 1][channels]`: the last d_conv-1 pre-conv inputs, oldest first.
    pub conv: Vec<f32>,
    pub conv_channels: usize,
    /// `[Hv][Dv][Dk]`: `ssm[h][j][i] = S_h[i][j]` (ggml layout, spec §4.4).
    pub ssm: Vec<f32>,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
}

impl RecurrentState {
    pub fn new(d_conv: usize, channels: usize, n_v_heads: usize, dk: usize, dv: usize) -> Self {
        RecurrentState {
            conv: vec![0.0; (d_conv - 1) * channels],
            conv_channels: channels,
            ssm: vec![0.0; n_v_heads * dv * dk],
            n_v_heads,
            head_k_dim: dk,
            head_v_dim: dv,
        }
    }
    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * 4
    }
}

/// The state one layer keeps for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    Kv(KvCache),
    Recurrent(RecurrentState),
    /// A layer without state (e.g. a layer type that needs none).
    None,
}

impl LayerState {
    pub fn bytes(&self) -> usize {
        match self {
            LayerState::Kv(k) => k.bytes(),
            LayerState::Recurrent(r) => r.bytes(),
            LayerState::None => 0,
        }
    }
    /// Back to the state of a fresh sequence (zero conv/ssm; KV contents are masked by
    /// position so they need not be cleared, but are, so stale data can never leak).
    pub fn reset(&mut self) {
        match self {
            LayerState::Kv(k) => {
                k.k.fill(0.0);
                k.v.fill(0.0);
            }
            LayerState::Recurrent(r) => {
                r.conv.fill(0.0);
                r.ssm.fill(0.0);
            }
            LayerState::None => {}
        }
    }
}
