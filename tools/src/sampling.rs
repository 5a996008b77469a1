//! Sampling flags shared by `pn run`, `pn chat` and `pn batch`.

use anyhow::Result;
use pn_engine::sampler::SamplerConfig;

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingOpts {
    /// Temperature (0 = greedy). Default 0.8, or 0.7 for the built-in model
    #[arg(long, allow_negative_numbers = true)]
    pub temp: Option<f32>,
    /// Top-k (0 = off)
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off)
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Min-p (0 = off)
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty (1 = off). Default 1.0, or 1.1 for the built-in model (it loops)
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Random seed (default or -1: from the clock; printed at the end)
    #[arg(long, short = 's', allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Greedy decoding: argmax, no repetition penalty unless --repeat-penalty is given
    /// (--temp 0 is greedy too, but keeps the default repetition penalty)
    #[arg(long, conflicts_with = "temp")]
    pub greedy: bool,
}

impl SamplingOpts {
    /// The sampler settings, with defaults that suit the built-in model when it runs.
    pub fn config(&self, builtin_model: bool) -> Result<SamplerConfig> {
        let seed = match self.seed {
            None | Some(-1) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
            Some(s) if s < 0 => anyhow::bail!("--seed: expected a value ≥ 0, or -1 for a random seed, found {s}"),
            Some(s) => s as u64,
        };
        let cfg = SamplerConfig {
            temperature: if self.greedy { 0.0 } else { self.temp.unwrap_or(if builtin_model { 0.7 } else { 0.8 }) },
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            // --greedy is plain argmax (llama.cpp's greedy) unless a penalty is asked for
            repeat_penalty: self.repeat_penalty.unwrap_or(if builtin_model && !self.greedy { 1.1 } else { 1.0 }),
            repeat_last_n: 64,
            seed,
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }
}
