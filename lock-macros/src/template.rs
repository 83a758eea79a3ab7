//! Key templates: `"inventory:{sku}"`, `"user:{req.user_id}:draw:{draw.id}"`, `{{` / `}}`.
//!
//! Parsing is purely textual; which names exist is decided against the function's parameters
//! in `expand`.

/// The longest key lock-core accepts (`lock_core::MAX_KEY_LEN`), in bytes: a template whose
/// fixed text alone is longer can never be a valid key.
pub(crate) const MAX_KEY_LEN: usize = 1024;

/// One piece of a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text used as is (braces already unescaped).
    Text(String),
    /// `{root.field.field}`: a parameter (or `self`) and a chain of fields, formatted by
    /// `Display`.
    Value(Placeholder),
}

/// A `{...}` in a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// What the user wrote between the braces.
    pub(crate) source: String,
    /// The parameter name (`self`, an identifier, or a raw identifier `r#type`).
    pub(crate) root: String,
    /// Field names or tuple indices, in order.
    pub(crate) fields: Vec<String>,
}

/// Splits a template into text and placeholders.
///
/// # Errors
/// A message for the first problem: an empty template, an unmatched or unclosed brace, an
/// empty placeholder, a format spec, or something that is not a `name.field` path.
pub(crate) fn parse(template: &str) -> Result<Vec<Segment>, String> {
    if template.is_empty() {
        return Err(
            "the key is empty: name the resource the lock protects, e.g. key = \"order:{id}\""
                .into(),
        );
    }
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.next_if(|&(_, n)| n == '{').is_some() => text.push('{'),
            '}' if chars.next_if(|&(_, n)| n == '}').is_some() => text.push('}'),
            '}' => {
                return Err(format!(
                    "unmatched `}}` at byte {at} of the key: write `}}}}` for a literal `}}`"
                ));
            }
            '{' => {
                let start = at + 1;
                let end = loop {
                    match chars.next() {
                        Some((i, '}')) => break i,
                        Some((_, '{')) | None => {
                            return Err(format!(
                                "unclosed `{{` at byte {at} of the key: close the placeholder with `}}`, or write `{{{{` for a literal `{{`"
                            ));
                        }
                        Some(_) => {}
                    }
                };
                let source = &template[start..end];
                let placeholder = placeholder(source)?;
                if !text.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut text)));
                }
                segments.push(Segment::Value(placeholder));
            }
            other => text.push(other),
        }
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    let fixed: usize = segments
        .iter()
        .map(|s| match s {
            Segment::Text(t) => t.len(),
            Segment::Value(_) => 0,
        })
        .sum();
    if fixed > MAX_KEY_LEN {
        return Err(format!(
            "the key's fixed text is {fixed} bytes, above the {MAX_KEY_LEN} bytes lock_core accepts (MAX_KEY_LEN)"
        ));
    }
    Ok(segments)
}

fn placeholder(source: &str) -> Result<Placeholder, String> {
    if source.is_empty() {
        return Err(
            "empty placeholder `{}` in the key: name a parameter, e.g. `{id}` (positional placeholders are not supported; write `{{}}` for literal braces)"
                .into(),
        );
    }
    if let Some((name, _spec)) = source.split_once(':') {
        return Err(format!(
            "format specs are not supported in keys: `{{{source}}}` would format `{name}` with a spec; keys use `Display`, write `{{{name}}}`"
        ));
    }
    let mut parts = source.split('.');
    let root = parts.next().unwrap_or_default();
    let fields: Vec<String> = parts.map(str::to_owned).collect();
    let valid = is_identifier(root) && fields.iter().all(|f| is_identifier(f) || is_index(f));
    if !valid {
        return Err(format!(
            "`{{{source}}}` in the key is not a parameter path: write `{{name}}` or `{{name.field.field}}` (parameters and their fields only: no expressions, method calls or spaces)"
        ));
    }
    Ok(Placeholder {
        source: source.to_owned(),
        root: root.to_owned(),
        fields,
    })
}

/// An identifier or raw identifier (`r#type`); keywords are refused later, by syn.
fn is_identifier(s: &str) -> bool {
    let s = s.strip_prefix("r#").unwrap_or(s);
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_alphabetic() || c == '_' => {}
        _ => return false,
    }
    s != "_" && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// A tuple index as Rust writes it: `0`, `1`, `12`, never `01`.
fn is_index(s: &str) -> bool {
    s.parse::<u32>().is_ok_and(|n| n.to_string() == s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(root: &str, fields: &[&str]) -> Segment {
        let source = std::iter::once(root)
            .chain(fields.iter().copied())
            .collect::<Vec<_>>()
            .join(".");
        Segment::Value(Placeholder {
            source,
            root: root.into(),
            fields: fields.iter().map(|f| (*f).to_owned()).collect(),
        })
    }

    fn text(t: &str) -> Segment {
        Segment::Text(t.into())
    }

    #[test]
    fn parses_text_placeholders_and_escapes() {
        assert_eq!(
            parse("inventory:{sku}"),
            Ok(vec![text("inventory:"), value("sku", &[])])
        );
        assert_eq!(
            parse("user:{req.user_id}:draw:{draw.id}"),
            Ok(vec![
                text("user:"),
                value("req", &["user_id"]),
                text(":draw:"),
                value("draw", &["id"]),
            ])
        );
        assert_eq!(
            parse("{{x}}:{p.0}"),
            Ok(vec![text("{x}:"), value("p", &["0"])])
        );
        assert_eq!(parse("{self.shard}"), Ok(vec![value("self", &["shard"])]));
        assert_eq!(parse("{r#type}"), Ok(vec![value("r#type", &[])]));
        assert_eq!(parse("jobs:nightly"), Ok(vec![text("jobs:nightly")]));
        assert_eq!(parse("a}}b{{"), Ok(vec![text("a}b{")]));
    }

    #[test]
    fn rejects_malformed_templates_with_a_hint() {
        for (bad, hint) in [
            ("", "the key is empty"),
            ("a}b", "unmatched `}` at byte 1"),
            ("a{b", "unclosed `{` at byte 1"),
            ("a{b{c}}", "unclosed `{` at byte 1"),
            ("a{}", "empty placeholder"),
            ("{id:?}", "format specs are not supported"),
            ("{id.len()}", "not a parameter path"),
            ("{ id }", "not a parameter path"),
            ("{a..b}", "not a parameter path"),
            ("{a.01}", "not a parameter path"),
            ("{1}", "not a parameter path"),
            ("{_}", "not a parameter path"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(hint), "{bad:?}: {err}");
        }
        let long = "x".repeat(MAX_KEY_LEN + 1);
        assert!(parse(&long).unwrap_err().contains("MAX_KEY_LEN"));
        assert!(parse(&format!("{}{{id}}", "x".repeat(MAX_KEY_LEN))).is_ok());
    }
}
