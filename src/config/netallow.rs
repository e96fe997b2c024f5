//! `callbacks.allow_networks`: the loopback, private, link-local,
//! unique-local and other guarded networks (`callbacks::guard`) a callback
//! may still be delivered to. Written as
//! a list of CIDR blocks or addresses (`["10.1.0.0/16", "::1"]`), or one
//! comma-separated string (the form `MAAS_CALLBACKS__ALLOW_NETWORKS` takes).

use std::fmt;

use ipnet::IpNet;

/// A list, or one comma-separated string (the form an environment
/// variable takes); entries trimmed, empty ones dropped. Also the reader of
/// `http.openai_models`.
pub(super) fn list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of strings or one comma-separated string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(t) = seq.next_element::<String>()? {
                let t = t.trim();
                if !t.is_empty() {
                    out.push(t.to_owned());
                }
            }
            Ok(out)
        }
    }
    d.deserialize_any(Visitor)
}

/// The networks, each a CIDR block or a single address; the first entry
/// that is neither is named.
pub fn parse(entries: &[String]) -> Result<Vec<IpNet>, String> {
    entries
        .iter()
        .map(|e| {
            e.parse::<IpNet>()
                .or_else(|_| e.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| format!("`{e}` is neither a network (10.0.0.0/8, fd00::/8) nor an address"))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn networks_and_addresses_parse_and_garbage_is_named() {
        let nets = parse(&["127.0.0.0/8".into(), "::1".into()]).unwrap();
        assert_eq!(nets[1].to_string(), "::1/128");
        assert!(parse(&["localhost".into()]).unwrap_err().contains("`localhost`"));
    }
}
