//! Chat-template rendering (engine/src/chat.rs).

use pn_engine::chat::{render_chat, render_for, ChatError, ChatMessage, CHATML_TEMPLATE};
use pn_engine::tokenizer::{Tokenizer, TokenizerData};
use pn_engine::Gguf;
use std::path::Path;

/// A Qwen3-style template (tools, namespace, reversed loop, think stripping, tojson).
const QWEN3_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("You are helpful."),
        ChatMessage::user("Hi"),
        ChatMessage::assistant("<think>\nhmm\n</think>\n\nHello!"),
        ChatMessage::new("tool", "42"),
        ChatMessage::user("2+2?"),
    ]
}

#[test]
fn qwen3_style_template() {
    let out = render_chat(QWEN3_TEMPLATE, &conversation(), true, "", "<|im_end|>").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n\
         <|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_gen = render_chat(QWEN3_TEMPLATE, &conversation()[..2], false, "", "").unwrap();
    assert_eq!(
        no_gen,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    // After the last user turn the thinking block is kept.
    let msgs = [
        ChatMessage::user("q"),
        ChatMessage::assistant("<think>r</think>a"),
    ];
    let out = render_chat(QWEN3_TEMPLATE, &msgs, false, "", "").unwrap();
    assert_eq!(out, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n");
}

#[test]
fn fixture_template_and_fallback() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let g = Gguf::open(&root.join("tests/fixtures/qwen35-vocab.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let msgs = [ChatMessage::user("Hello")];
    let out = render_for(&tok, &msgs, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&out, true);
    assert_eq!(ids[0], 248045);
    assert_eq!(ids.iter().filter(|&&i| i == 248046).count(), 1);
    // Same output from the built-in ChatML fallback.
    assert_eq!(
        render_chat(CHATML_TEMPLATE, &msgs, true, "", "").unwrap(),
        out
    );
    let bare = Tokenizer::new(TokenizerData {
        tokens: vec!["a".into(), "b".into()],
        merges: vec![],
        ..Default::default()
    })
    .unwrap();
    assert!(bare.chat_template().is_none());
    assert_eq!(render_for(&bare, &msgs, true).unwrap(), out);
}

#[test]
fn jinja_features() {
    let msgs = [ChatMessage::user("  Hi there  ")];
    let t = "{{ bos_token }}{% for m in messages %}[{{ m['role'] | upper }}] {{ m.content.strip() }}|{{ m.content.split()|length }}{% if m.content.endswith('  ') %}!{% endif %}{% endfor %}{{ eos_token }}";
    assert_eq!(
        render_chat(t, &msgs, false, "<s>", "</s>").unwrap(),
        "<s>[USER] Hi there|2!</s>"
    );
    let j = render_chat("{{ messages | tojson }}", &msgs, false, "", "").unwrap();
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v[0]["content"], "  Hi there  ");
    let lc = "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% endfor %}";
    assert_eq!(
        render_chat(
            lc,
            &[ChatMessage::user("a"), ChatMessage::user("b")],
            false,
            "",
            ""
        )
        .unwrap(),
        "b"
    );
}

#[test]
fn errors_are_typed() {
    let t = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System role required') }}{% endif %}ok";
    match render_chat(t, &[ChatMessage::user("x")], false, "", "") {
        Err(ChatError::Raised(m)) => assert_eq!(m, "System role required"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        render_chat(t, &[ChatMessage::system("x")], false, "", "").unwrap(),
        "ok"
    );
    assert!(matches!(
        render_chat("{% for %}", &[], false, "", ""),
        Err(ChatError::Syntax(_))
    ));
    assert!(matches!(
        render_chat("{{ 1 + messages }}", &[], false, "", ""),
        Err(ChatError::Render(_))
    ));
}
