//! Message headers: [`Headers`], and their JSON form for SQL backends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Message headers: names are case-sensitive tokens, values are text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers(BTreeMap::new())
    }

    /// Set a header, replacing any earlier value. Validated when the message is built.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    /// A header's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Headers in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl Headers {
    /// The headers as a JSON object of strings, the form SQL backends store them in.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.iter()
                .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
                .collect(),
        )
    }

    /// Headers from a JSON object of strings.
    ///
    /// # Errors
    /// A readable reason (for a dead letter's `last_error`) when `value` is not an
    /// object or a value is not a string.
    pub fn from_json(value: serde_json::Value) -> std::result::Result<Headers, String> {
        let serde_json::Value::Object(map) = value else {
            return Err(format!("headers are not a JSON object: {value}"));
        };
        map.into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(v) => Ok((name, v)),
                other => Err(format!("header {name:?} is not a string: {other}")),
            })
            .collect()
    }

    /// The string-valued entries of a JSON object, ignoring the rest: for listing dead
    /// letters whose headers did not decode.
    pub fn from_json_lossy(value: serde_json::Value) -> Headers {
        match value {
            serde_json::Value::Object(map) => map
                .into_iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_owned())))
                .collect(),
            _ => Headers::new(),
        }
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Headers(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_json_and_reject_non_strings() {
        let headers: Headers = [("a", "1"), ("b", "two")].into_iter().collect();
        assert_eq!(Headers::from_json(headers.to_json()).unwrap(), headers);
        let not_string = serde_json::json!({"a": 1, "b": "x"});
        assert!(Headers::from_json(not_string.clone())
            .unwrap_err()
            .contains("\"a\""));
        assert_eq!(Headers::from_json_lossy(not_string).get("b"), Some("x"));
        for not_object in [serde_json::json!(["a"]), serde_json::json!(null)] {
            assert!(Headers::from_json(not_object.clone()).is_err());
            assert!(Headers::from_json_lossy(not_object).is_empty());
        }
    }
}
