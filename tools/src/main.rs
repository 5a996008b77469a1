//! `pn`: the Pantheon command line.
#![forbid(unsafe_code)]

mod chat_input;
mod bench_draft;
mod cmd_batch;
mod cmd_bench;
mod cmd_chat;
mod cmd_diff;
mod cmd_dump;
mod cmd_info;
mod cmd_logits;
mod cmd_perplexity;
mod cmd_run;
mod cmd_serve;
mod cmd_synth;
mod cmd_tokenize;
mod draft;
mod generate;
mod load;
mod output;
mod progress;
mod prompt;
mod sampling;
mod synth_arch;
mod synth_write;
mod tensor_opts;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "pn", version, about = "Pantheon: a graph inference engine for qwen35moe GGUF models")]
struct Cli {
    /// No progress bars and no load line on stderr
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text (streams as it is generated). Without --model, runs the built-in default model.
    Run(cmd_run::RunArgs),
    /// Interactive multi-turn chat with the model's chat template.
    Chat(cmd_chat::ChatArgs),
    /// Write every requested position's logits as JSON (the oracle's llama_oracle.py format).
    Logits(cmd_logits::LogitsArgs),
    /// Show metadata, the layer map and the tensor table of a GGUF.
    Info(cmd_info::InfoArgs),
    /// Perplexity of a text file (llama-perplexity's method: windows of --ctx tokens, the second half of each scored).
    Perplexity(cmd_perplexity::PerplexityArgs),
    /// Tokenize text with the model's tokenizer.
    Tokenize(cmd_tokenize::TokenizeArgs),
    /// Run many prompts through the decode slots (continuous batching): one JSON line per prompt.
    Batch(cmd_batch::BatchArgs),
    /// Prefill and decode tokens/s as one JSON line (like the oracle's llama_bench.py).
    Bench(cmd_bench::BenchArgs),
    /// Print the model's graph (text, Graphviz DOT or JSON).
    Dump(cmd_dump::DumpArgs),
    /// Compare every named tensor with a reference dump and name the first divergence.
    Diff(cmd_diff::DiffArgs),
    /// Serve the model over HTTP with an OpenAI-compatible API (docs/server.md).
    Serve(cmd_serve::ServeArgs),
    /// Write a synthetic qwen35moe GGUF with seeded random weights (any preset and weight type).
    Synth(cmd_synth::SynthArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    progress::set_quiet(cli.quiet);
    let res = match cli.cmd {
        Cmd::Run(a) => cmd_run::run(a),
        Cmd::Logits(a) => cmd_logits::run(a),
        Cmd::Info(a) => cmd_info::run(a),
        Cmd::Tokenize(a) => cmd_tokenize::run(a),
        Cmd::Bench(a) => cmd_bench::run(a),
        Cmd::Batch(a) => cmd_batch::run(a),
        Cmd::Chat(a) => cmd_chat::run(a),
        Cmd::Dump(a) => cmd_dump::run(a),
        Cmd::Diff(a) => cmd_diff::run(a),
        Cmd::Synth(a) => cmd_synth::run(a),
        Cmd::Perplexity(a) => cmd_perplexity::run(a),
        Cmd::Serve(a) => cmd_serve::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        // the reader went away (`pn run | head`): not a failure
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            output::report_error(&e);
            ExitCode::FAILURE
        }
    }
}
