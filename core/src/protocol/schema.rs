//! Schemas for wire fields whose Rust type is wider than what the engine accepts: a `String` that
//! must be one of a few names, tags with limits. Each is the schema of the wire type (the serde
//! representation is the field's own) narrowed by the engine's rules, written from the engine's
//! constants so that they cannot drift; the tests below check them against the engine.

use std::borrow::Cow;

use evervm_engine as engine;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::json;

fn schema(value: serde_json::Value) -> Schema {
    match value {
        serde_json::Value::Object(map) => Schema::from(map),
        // Every schema below is written as an object.
        _ => Schema::default(),
    }
}

/// The regular expression of a tag key (`engine::validate_tags`): ASCII only, so its length in
/// characters is its length in bytes.
fn tag_key_pattern() -> String {
    format!("^[A-Za-z0-9_./:-]{{1,{}}}$", engine::MAX_TAG_KEY_BYTES)
}

/// The regular expression of a tag value: no control character (Unicode category Cc, which is
/// what Rust's `char::is_control` tests).
const TAG_VALUE_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// The regular expression of a checkpoint name (`engine::validate_checkpoint_name`).
const CHECKPOINT_NAME_PATTERN: &str = "^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$";

/// The built-in images.
#[cfg(test)]
const IMAGES: &[&str] = &["minimal", "data"];

/// The regular expression of an image's name (`engine::guest::image::is_image_name`).
const IMAGE_PATTERN: &str = "^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$";

/// The durabilities a new machine may ask for.
pub(crate) const DURABILITIES: &[&str] = &["idle", "instruction"];

/// A rich result ([`engine::RichResult`]): its kind and its MIME bundle.
pub(crate) struct RichResult;

impl JsonSchema for RichResult {
    fn schema_name() -> Cow<'static, str> {
        "RichResult".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let kinds: Vec<&str> = engine::RichKind::ALL.iter().map(|k| k.as_str()).collect();
        schema(json!({
            "type": "object",
            "description": "A rich result, following Jupyter's display protocol: `display` (shown \
                by `display(obj)`), `figure` (a matplotlib figure, as PNG) or `value` (the last \
                expression's value, when it has more than text), and its MIME bundle.",
            "required": ["kind", "data"],
            "properties": {
                "kind": { "type": "string", "enum": kinds },
                "data": {
                    "type": "object",
                    "description": "MIME type to representation: text for text types and \
                        `image/svg+xml`, base64 for other images (`image/png`), any JSON value \
                        for JSON types. `text/plain` is always there.",
                    "additionalProperties": true,
                },
            },
        }))
    }
}

/// [`super::WireTags`] as a new machine or a fork takes them.
pub(crate) struct Tags;

/// An install's requirements (see `evervm_engine::packages`).
pub(crate) struct Requirements;

impl JsonSchema for Requirements {
    fn schema_name() -> Cow<'static, str> {
        "Requirements".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        use evervm_engine::packages::{MAX_REQUIREMENT_BYTES, MAX_REQUIREMENTS};
        schema(json!({
            "type": "array",
            "description": "PEP 508 requirements (`requests==2.32.3`), each optionally followed \
                            by `--hash=sha256:HEX`.",
            "minItems": 1,
            "maxItems": MAX_REQUIREMENTS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_REQUIREMENT_BYTES},
        }))
    }
}

impl JsonSchema for Tags {
    fn schema_name() -> Cow<'static, str> {
        "Tags".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "object",
            "description": format!(
                "String keys and values. Keys: 1 to {} bytes of letters, digits, `_`, `-`, `.`, \
                 `/`, `:`; values: at most {} bytes, no control characters; at most {} pairs.",
                engine::MAX_TAG_KEY_BYTES,
                engine::MAX_TAG_VALUE_BYTES,
                engine::MAX_TAGS,
            ),
            "maxProperties": engine::MAX_TAGS,
            "propertyNames": { "pattern": tag_key_pattern() },
            "additionalProperties": {
                "type": "string",
                // Characters, where the engine counts bytes: a value of non-ASCII characters
                // may be refused below this length, never above it.
                "maxLength": engine::MAX_TAG_VALUE_BYTES,
                "pattern": TAG_VALUE_PATTERN,
            },
        }))
    }
}

/// A machine's environment variables (`env`, `secret_env`) as a new machine takes them.
pub(crate) struct Env;

impl JsonSchema for Env {
    fn schema_name() -> Cow<'static, str> {
        "Env".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "object",
            "description": format!(
                "Environment variables: names of letters, digits and `_`, not starting with a \
                 digit, at most {} bytes; values without NUL; at most {} variables and {} bytes \
                 together (with the other map).",
                engine::MAX_ENV_NAME_BYTES,
                engine::MAX_ENV_VARS,
                engine::MAX_ENV_BYTES,
            ),
            "maxProperties": engine::MAX_ENV_VARS,
            "propertyNames": {
                "pattern": format!("^[A-Za-z_][A-Za-z0-9_]{{0,{}}}$", engine::MAX_ENV_NAME_BYTES - 1)
            },
            "additionalProperties": { "type": "string", "pattern": "^[^\\u0000]*$" },
        }))
    }
}

/// An instruction's code: at most [`engine::MAX_CODE_BYTES`] bytes (the schema can only count
/// characters), no NUL.
pub(crate) struct Code;

impl JsonSchema for Code {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Code".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "string",
            "maxLength": engine::MAX_CODE_BYTES,
            "pattern": CODE_PATTERN,
        }))
    }
}

/// The regular expression of code: no NUL character, which Python cannot compile (the engine's
/// rule; `core/tests/server.rs` tests it over HTTP).
const CODE_PATTERN: &str = "^[^\\u0000]*$";

/// An image profile's name.
pub(crate) struct Image;

impl JsonSchema for Image {
    fn schema_name() -> Cow<'static, str> {
        "Image".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "string",
            "description": "`minimal`, `data`, or the name of a custom image built on the server \
                            with `evervm image build FILE` (an unknown name is a 400).",
            "pattern": IMAGE_PATTERN,
        }))
    }
}

/// A durability's name.
pub(crate) struct Durability;

impl JsonSchema for Durability {
    fn schema_name() -> Cow<'static, str> {
        "Durability".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({ "type": "string", "enum": DURABILITIES, "default": DURABILITIES[0] }))
    }
}

/// A network policy (`evervm_engine::network::NetworkPolicy`).
pub(crate) struct Network;

impl JsonSchema for Network {
    fn schema_name() -> Cow<'static, str> {
        "Network".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "oneOf": [
                {
                    "type": "object",
                    "required": ["mode"],
                    "additionalProperties": false,
                    "properties": {
                        "mode": { "type": "string", "enum": ["none", "public"] },
                        "allow": { "type": "array", "maxItems": 0 },
                    },
                },
                {
                    "type": "object",
                    "required": ["mode", "allow"],
                    "additionalProperties": false,
                    "properties": {
                        "mode": { "type": "string", "enum": ["allow"] },
                        "allow": {
                            "type": "array",
                            "description": "Domain names (`example.com`; `*.example.com` for \
                                every name under it), IPv4 addresses and IPv4 CIDR blocks.",
                            "minItems": 1,
                            "maxItems": engine::network::MAX_ALLOW_RULES,
                            "items": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": engine::network::MAX_RULE_BYTES,
                                "pattern": engine::network::RULE_PATTERN,
                            },
                        },
                    },
                },
            ],
            "examples": [{ "mode": "allow", "allow": ["pypi.org", "*.pythonhosted.org"] }],
        }))
    }
}

/// A context's working directory: a path without NUL, at most
/// [`engine::MAX_CONTEXT_CWD_CHARS`] characters.
pub(crate) struct ContextCwd;

impl JsonSchema for ContextCwd {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "ContextCwd".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "string",
            "minLength": 1,
            "maxLength": engine::MAX_CONTEXT_CWD_CHARS,
            "pattern": CODE_PATTERN,
        }))
    }
}

/// A context's id.
pub(crate) struct ContextId;

impl JsonSchema for ContextId {
    fn schema_name() -> Cow<'static, str> {
        "ContextId".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "string",
            "description": "`default` (the machine's own interpreter), or a context's id: 1 to 64 \
                letters, digits, `_` or `-`.",
            "pattern": "^[A-Za-z0-9_-]{1,64}$",
            "examples": ["default"],
        }))
    }
}

/// A checkpoint's name.
pub(crate) struct CheckpointName;

impl JsonSchema for CheckpointName {
    fn schema_name() -> Cow<'static, str> {
        "CheckpointName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "type": "string",
            "description": "1 to 64 letters, digits, `_`, `-` or `.`, not starting with `.`.",
            "pattern": CHECKPOINT_NAME_PATTERN,
            "examples": ["before-training"],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny matcher for the patterns above (a character class with a repeat count, twice at
    /// most): enough to test them against the engine without a regex engine.
    fn matches_class(c: char, class: &str) -> bool {
        let chars: Vec<char> = class.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if i + 2 < chars.len() && chars[i + 1] == '-' {
                if (chars[i]..=chars[i + 2]).contains(&c) {
                    return true;
                }
                i += 3;
            } else {
                if chars[i] == c {
                    return true;
                }
                i += 1;
            }
        }
        false
    }

    #[test]
    fn image_names_follow_the_engine() {
        let pattern = regex::Regex::new(IMAGE_PATTERN).unwrap();
        let mut names: Vec<String> = [
            "a", "data", "minimal", "my-image", "x1", "a-", "-a", "1a", "A", "a_b", "a.b", "", "é",
        ]
        .iter()
        .map(|n| (*n).to_owned())
        .collect();
        names.push("a".repeat(40));
        names.push("a".repeat(41));
        for first in ['a', 'z', '0', '-', 'A'] {
            for second in ['a', '9', '-', '_', ' '] {
                names.push(format!("{first}{second}"));
                names.push(format!("{first}{second}b"));
            }
        }
        for name in names {
            assert_eq!(
                pattern.is_match(&name),
                engine::guest::image::is_image_name(&name),
                "{name:?}"
            );
        }
    }

    #[test]
    fn allow_rules_follow_the_engine() {
        // The schema's pattern and length against the engine's parser: a rule is accepted by
        // one exactly when by the other (schemathesis holds the server to the schema both ways).
        let pattern = regex::Regex::new(engine::network::RULE_PATTERN).unwrap();
        let by_schema = |rule: &str| {
            pattern.is_match(rule)
                && !rule.is_empty()
                && rule.chars().count() <= engine::network::MAX_RULE_BYTES
        };
        let by_engine = |rule: &str| {
            engine::network::NetworkPolicy::new(engine::network::NetworkMode::Allow, &[rule])
                .is_ok()
        };
        let label = "a".repeat(63);
        let long_label = "a".repeat(64);
        let long_rule = format!("{label}.{label}.{label}.{}", "b".repeat(63));
        let too_long = format!("{long_rule}.c");
        let mut rules: Vec<String> = [
            "example.com",
            "EXAMPLE.com.",
            "*.example.com",
            "*.",
            "*",
            "a",
            "a_b.c",
            "_srv.x",
            "-a.com",
            "a-.com",
            "a--b.com",
            "a..b",
            ".a",
            "a.",
            "*.*.a",
            "ex*ample.com",
            "1.2.3.4",
            "1.2.3.4/8",
            "1.2.3.4/32",
            "1.2.3.4/33",
            "1.2.3.4/08",
            "01.2.3.4",
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.",
            "0.0.0.0/0",
            "::1",
            "2001:db8::/32",
            "fe80::1%eth0",
            "a b",
            " a.com",
            "a.com ",
            "a.com\n",
            "bücher.de",
            "a/b",
            "a:b",
            "",
            label.as_str(),
            long_label.as_str(),
            long_rule.as_str(),
            too_long.as_str(),
        ]
        .iter()
        .map(|r| (*r).to_owned())
        .collect();
        // And a sweep of short strings over the characters that matter.
        let alphabet = ['a', '0', '9', '-', '_', '.', '*', '/', ':', '3', '2'];
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    rules.push(format!("{a}{b}{c}"));
                    rules.push(format!("1.2.3.{a}{b}{c}"));
                }
            }
        }
        for rule in &rules {
            assert_eq!(by_schema(rule), by_engine(rule), "{rule:?}");
        }
    }

    #[test]
    fn env_names_follow_the_engine() {
        // The schema's pattern, by hand: a letter or `_`, then letters, digits and `_`.
        let by_pattern = |name: &str| {
            let mut chars = name.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
                && name.len() <= engine::MAX_ENV_NAME_BYTES
        };
        let long = "A".repeat(engine::MAX_ENV_NAME_BYTES);
        let too_long = "A".repeat(engine::MAX_ENV_NAME_BYTES + 1);
        for name in [
            "A",
            "_x9",
            "a-b",
            "9a",
            "",
            "é",
            "A B",
            long.as_str(),
            too_long.as_str(),
        ] {
            let env = engine::Env::from([(
                name.to_owned(),
                engine::EnvVar {
                    value: String::new(),
                    secret: false,
                },
            )]);
            assert_eq!(
                engine::validate_env(&env).is_ok(),
                by_pattern(name),
                "{name:?}"
            );
        }
        let text =
            serde_json::to_string(&Env::json_schema(&mut SchemaGenerator::default())).unwrap();
        assert!(text.contains("^[A-Za-z_][A-Za-z0-9_]{0,255}$"), "{text}");
    }

    #[test]
    fn tag_keys_follow_the_engine() {
        assert_eq!(tag_key_pattern(), "^[A-Za-z0-9_./:-]{1,128}$");
        let class = "A-Za-z0-9_./:";
        for c in (0..=0x2ffu32).filter_map(char::from_u32) {
            let key = c.to_string();
            let tags = engine::Tags::from([(key, String::new())]);
            let allowed = matches_class(c, class) || c == '-';
            assert_eq!(engine::validate_tags(&tags).is_ok(), allowed, "{c:?}");
        }
        let long = |n| engine::Tags::from([("k".repeat(n), String::new())]);
        assert!(engine::validate_tags(&long(engine::MAX_TAG_KEY_BYTES)).is_ok());
        assert!(engine::validate_tags(&long(engine::MAX_TAG_KEY_BYTES + 1)).is_err());
        assert!(engine::validate_tags(&long(0)).is_err());
    }

    #[test]
    fn tag_values_follow_the_engine() {
        for c in (0..=0x2ffu32).filter_map(char::from_u32) {
            let tags = engine::Tags::from([("k".to_owned(), c.to_string())]);
            let control = matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}');
            assert_eq!(engine::validate_tags(&tags).is_ok(), !control, "{c:?}");
        }
        assert_eq!(TAG_VALUE_PATTERN, "^[^\\u0000-\\u001f\\u007f-\\u009f]*$");
        let many: engine::Tags = (0..=engine::MAX_TAGS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(engine::validate_tags(&many).is_err());
    }

    #[test]
    fn checkpoint_names_follow_the_engine() {
        let first = "A-Za-z0-9_-";
        let rest = "A-Za-z0-9_.-";
        assert_eq!(
            CHECKPOINT_NAME_PATTERN,
            format!("^[{first}][{rest}]{{0,63}}$")
        );
        for c in (0..=0x2ffu32).filter_map(char::from_u32) {
            let alone = c.to_string();
            assert_eq!(
                engine::validate_checkpoint_name(&alone).is_ok(),
                matches_class(c, first) || c == '-',
                "{alone:?}"
            );
            let second = format!("a{c}");
            assert_eq!(
                engine::validate_checkpoint_name(&second).is_ok(),
                matches_class(c, rest) || c == '-',
                "{second:?}"
            );
        }
        assert!(engine::validate_checkpoint_name(&"a".repeat(64)).is_ok());
        assert!(engine::validate_checkpoint_name(&"a".repeat(65)).is_err());
        assert!(engine::validate_checkpoint_name("").is_err());
    }

    #[test]
    fn names_are_the_engines() {
        for image in IMAGES {
            assert!(
                engine::guest::image::Profile::parse(image).is_ok(),
                "{image}"
            );
        }
        for durability in DURABILITIES {
            assert_eq!(
                engine::Durability::parse(durability)
                    .ok()
                    .map(engine::Durability::as_str),
                Some(*durability)
            );
        }
        assert_eq!(engine::Durability::default().as_str(), DURABILITIES[0]);
    }
}
