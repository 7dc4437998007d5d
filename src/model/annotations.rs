//! What people and training code attach to a study or a trial: a note, tags, and user
//! attributes (named values a training script records beside its metrics, as Optuna's
//! `set_user_attr`). The optimizer never reads them; a change to them changes nothing else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;

/// The longest note, in characters.
pub const MAX_NOTE_CHARS: usize = 10_000;
/// Tags on one study or trial, at most.
pub const MAX_TAGS: usize = 32;
/// The longest tag, in characters.
pub const MAX_TAG_CHARS: usize = 64;
/// User attributes of one study or trial, at most.
pub const MAX_USER_ATTRS: usize = 64;
/// The longest user attribute name, in characters.
pub const MAX_USER_ATTR_KEY_CHARS: usize = 128;
/// The largest user attribute value, as JSON, in bytes.
pub const MAX_USER_ATTR_VALUE_BYTES: usize = 4096;

/// A study's or trial's note, tags and user attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Annotations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = BTreeMap<String, serde_json::Value>)]
    pub user_attrs: BTreeMap<String, serde_json::Value>,
}

/// A change of annotations: each field given replaces (note, tags) or merges into (user
/// attributes, where `null` removes one) what is stored; a field left out stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AnnotationUpdate {
    /// The note (plain text; an empty one removes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The tags, all of them (an empty list removes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// User attributes to set (any JSON value) or, with `null`, to remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, serde_json::Value>>)]
    pub user_attrs: Option<BTreeMap<String, serde_json::Value>>,
}

impl AnnotationUpdate {
    pub fn is_empty(&self) -> bool {
        self.note.is_none() && self.tags.is_none() && self.user_attrs.is_none()
    }

    /// Only user attributes: what a trial's own token may change.
    pub fn only_user_attrs(&self) -> bool {
        self.note.is_none() && self.tags.is_none()
    }

    /// The update checked and normalised: tags trimmed and without repeats (in their
    /// order). An empty note stays empty: the store removes it.
    pub fn validate(mut self) -> Result<AnnotationUpdate, ValidationError> {
        if let Some(note) = &self.note {
            if note.chars().count() > MAX_NOTE_CHARS {
                return Err(ValidationError::new(
                    "note",
                    format!("at most {MAX_NOTE_CHARS} characters"),
                ));
            }
            if note
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t')
            {
                return Err(ValidationError::new(
                    "note",
                    "control characters other than newlines and tabs are not allowed",
                ));
            }
        }
        if let Some(tags) = self.tags.take() {
            let mut kept: Vec<String> = Vec::with_capacity(tags.len());
            for (i, tag) in tags.into_iter().enumerate() {
                let field = format!("tags[{i}]");
                let tag = tag.trim().to_string();
                if tag.is_empty() || tag.chars().count() > MAX_TAG_CHARS {
                    return Err(ValidationError::new(
                        field,
                        format!("a tag is 1 to {MAX_TAG_CHARS} characters"),
                    ));
                }
                if tag.chars().any(char::is_control) {
                    return Err(ValidationError::new(
                        field,
                        "control characters are not allowed",
                    ));
                }
                if !kept.contains(&tag) {
                    kept.push(tag);
                }
            }
            if kept.len() > MAX_TAGS {
                return Err(ValidationError::new(
                    "tags",
                    format!("at most {MAX_TAGS} tags"),
                ));
            }
            self.tags = Some(kept);
        }
        if let Some(attrs) = &self.user_attrs {
            if attrs.len() > MAX_USER_ATTRS {
                return Err(ValidationError::new(
                    "user_attrs",
                    format!("at most {MAX_USER_ATTRS} attributes"),
                ));
            }
            for (key, value) in attrs {
                let field = format!("user_attrs.{key}");
                if key.is_empty()
                    || key.chars().count() > MAX_USER_ATTR_KEY_CHARS
                    || key.chars().any(char::is_control)
                {
                    return Err(ValidationError::new(
                        field,
                        format!(
                            "a name is 1 to {MAX_USER_ATTR_KEY_CHARS} characters, none of them \
                             control characters"
                        ),
                    ));
                }
                if value.to_string().len() > MAX_USER_ATTR_VALUE_BYTES {
                    return Err(ValidationError::new(
                        field,
                        format!("at most {MAX_USER_ATTR_VALUE_BYTES} bytes of JSON"),
                    ));
                }
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(v: serde_json::Value) -> AnnotationUpdate {
        serde_json::from_value(v).expect("an update")
    }

    #[test]
    fn tags_are_trimmed_and_kept_once_in_their_order() {
        let u = update(json!({"tags": [" baseline", "adam ", "baseline"]}))
            .validate()
            .expect("valid");
        assert_eq!(u.tags, Some(vec!["baseline".into(), "adam".into()]));
    }

    #[test]
    fn bad_annotations_name_their_field() {
        let cases = [
            (json!({"tags": ["ok", " "]}), "tags[1]"),
            (json!({"tags": ["a\u{7}"]}), "tags[0]"),
            (json!({"note": "x".repeat(MAX_NOTE_CHARS + 1)}), "note"),
            (json!({"note": "bell \u{7}"}), "note"),
            (json!({"user_attrs": {"": 1}}), "user_attrs."),
            (
                json!({"user_attrs": {"big": "x".repeat(MAX_USER_ATTR_VALUE_BYTES)}}),
                "user_attrs.big",
            ),
        ];
        for (input, field) in cases {
            let e = update(input.clone()).validate().expect_err("refused");
            assert_eq!(e.field, field, "{input}");
        }
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert_eq!(
            update(json!({ "tags": many }))
                .validate()
                .expect_err("too many")
                .field,
            "tags"
        );
        // A note keeps its lines; null user attributes are removals, not errors.
        let u = update(json!({"note": "line one\n\tline two", "user_attrs": {"gone": null}}))
            .validate()
            .expect("valid");
        assert!(!u.only_user_attrs() && !u.is_empty());
    }
}
