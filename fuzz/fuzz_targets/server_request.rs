//! pn serve's request parsing and validation on arbitrary bodies: the first byte picks
//! the endpoint (even: chat, odd: completions), the rest is the body. Parse (serde with
//! the field path), then the checks `pn serve` runs before queueing: the model's fields,
//! the sampling ranges, the messages or the prompt, the chat template (the default
//! model's). Checked: no panic; every rejection is a 4xx with a message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pn_engine::tokenizer::Tokenizer;
use pn_server::params::{self, Endpoint, Request};
use pn_server::{ApiError, Defaults};
use std::sync::OnceLock;

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/default/pn-default-code-q4_k_m.gguf");
        let g = pn_engine::Gguf::open(std::path::Path::new(path)).expect("the default model");
        Tokenizer::from_gguf(&g).expect("its tokenizer")
    })
}

fn rejected(e: ApiError) {
    assert!(e.status.is_client_error(), "{} for a bad request: {}", e.status, e.message);
    assert!(!e.message.is_empty());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else { return };
    let ep = if mode & 1 == 0 { Endpoint::Chat } else { Endpoint::Completions };
    let req: Request = match params::parse(body) {
        Ok(r) => r,
        Err(e) => return rejected(e),
    };
    let tok = tok();
    let defaults = Defaults { sampler: pn_engine::sampler::SamplerConfig::greedy(), seed: None };
    if let Err(e) = req.gen_params(ep, &defaults, tok.n_vocab()) {
        return rejected(e);
    }
    let _ = (req.stream(), req.include_usage());
    match ep {
        Endpoint::Chat => match params::chat_messages(req.messages.as_deref()) {
            Ok(msgs) if msgs.iter().map(|(_, c)| c.len()).sum::<usize>() < 4096 => {
                if let Err(e) = pn_server::prompt::render_chat(tok, &msgs) {
                    rejected(e);
                }
            }
            Ok(_) => {}
            Err(e) => rejected(e),
        },
        Endpoint::Completions => {
            if let Err(e) = params::completion_prompt(req.prompt.as_ref(), tok.n_vocab()) {
                rejected(e);
            }
        }
    }
});
