//! Where `pn run`'s prompt comes from (`-p TEXT`, `-p -`, `-f FILE`, `-f -`, piped stdin)
//! and llama.cpp's `-e` escapes.

use crate::output::read_text;
use anyhow::{bail, Result};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Clone, Debug)]
pub struct PromptOpts {
    /// Prompt text (special tokens such as <|im_start|> are parsed); `-` reads stdin.
    /// Without -p or -f, text piped on stdin is the prompt
    #[arg(long, short = 'p', conflicts_with = "file", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the prompt from this file (`-` = stdin)
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// Process escapes (\n, \r, \t, \', \", \\, \xHH) in the prompt and in --stop
    #[arg(long, short = 'e')]
    pub escape: bool,
}

/// Where the prompt came from, for messages.
pub enum Source {
    Flag,
    File,
    Stdin,
}

impl PromptOpts {
    /// The prompt, or None when none was given (no flag, and stdin is a terminal or empty).
    pub fn read(&self) -> Result<Option<(String, Source)>> {
        let got = match (&self.prompt, &self.file) {
            (Some(p), _) if p == "-" => Some((read_text(Path::new("-"), "-p -")?, Source::Stdin)),
            (Some(p), _) => Some((p.clone(), Source::Flag)),
            (None, Some(f)) => Some((read_text(f, "-f")?, if crate::output::is_dash(f) { Source::Stdin } else { Source::File })),
            (None, None) if !std::io::stdin().is_terminal() => {
                let s = read_text(Path::new("-"), "stdin")?;
                // nothing piped (e.g. </dev/null): as if no prompt was given
                (!s.is_empty()).then_some((s, Source::Stdin))
            }
            (None, None) => None,
        };
        Ok(match got {
            Some((t, src)) if self.escape => Some((unescape(&t)?, src)),
            other => other,
        })
    }
}

/// llama.cpp's `-e`: `\n \r \t \' \" \\ \xHH`; any other backslash stays as it is.
pub fn unescape(s: &str) -> Result<String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' => {
                let hex = s.get(i..i + 2).filter(|h| h.bytes().all(|x| x.is_ascii_hexdigit()));
                match hex {
                    Some(h) => {
                        out.push(u8::from_str_radix(h, 16).expect("two hex digits"));
                        i += 2;
                    }
                    None => bail!("-e: expected two hex digits after \\x, found {:?}", s.get(i..).unwrap_or("").chars().take(2).collect::<String>()),
                }
            }
            _ => out.extend_from_slice(&[b'\\', c]),
        }
    }
    String::from_utf8(out).map_err(|_| anyhow::anyhow!("-e: the \\x escapes do not form UTF-8 text"))
}

/// The `--stop` strings, unescaped with `-e`; an empty one is an error.
pub fn stops(raw: &[String], escape: bool) -> Result<Vec<String>> {
    let v: Vec<String> = if escape { raw.iter().map(|s| unescape(s)).collect::<Result<_>>()? } else { raw.to_vec() };
    if v.iter().any(String::is_empty) {
        bail!("--stop: expected a non-empty string, found \"\"");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes_like_llama_cpp() {
        assert_eq!(unescape(r"a\nb\tc\\d\'e\x41\q").unwrap(), "a\nb\tc\\d'eA\\q");
        assert_eq!(unescape(r"end\").unwrap(), "end\\");
        assert!(unescape(r"\xZZ").unwrap_err().to_string().contains("hex"));
        assert!(unescape(r"\xff").is_err());
        assert_eq!(unescape(r"\xc3\xa9").unwrap(), "é");
    }
}
