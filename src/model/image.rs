//! Container image references, parsed by the grammar that registries and engines share
//! (the distribution project's `reference` grammar, which OCI's distribution spec follows):
//! `[domain[:port]/]path[:tag][@digest]`. A spec's `image` becomes an engine's argument, so
//! only a reference by this grammar is accepted (nothing that starts with `-`, no spaces),
//! and `--job-images` matches a reference by its parts, not by its text.

use std::sync::LazyLock;

use regex::Regex;

/// The longest name (domain and path) that registries accept.
const MAX_NAME_LEN: usize = 255;

/// One path component: lower-case letters and digits, with `.`, `_`, `__` or dashes between.
const PATH_COMPONENT: &str = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
/// A host name component, an IPv4 address's parts included.
const DOMAIN_COMPONENT: &str = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";

static PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!("^{PATH_COMPONENT}(?:/{PATH_COMPONENT})*$")).expect("path regex")
});
static DOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^(?:{DOMAIN_COMPONENT}(?:\.{DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?$"
    ))
    .expect("domain regex")
});
static TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[\w][\w.-]{0,127}$").expect("tag regex"));
static DIGEST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
        .expect("digest regex")
});

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The registry (`registry.example.com:5000`, `localhost`), when the reference names one.
    pub domain: Option<String>,
    /// The repository's path components (`ml/trainer`).
    pub path: Vec<String>,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parse `text`, or say what is wrong with it.
    pub fn parse(text: &str) -> Result<ImageRef, String> {
        if text.is_empty() {
            return Err("an image reference is required".into());
        }
        if text.starts_with('-') {
            return Err("an image reference never starts with '-'".into());
        }
        let (rest, digest) = match text.split_once('@') {
            Some((name, digest)) => {
                if !DIGEST.is_match(digest) {
                    return Err(format!(
                        "{digest:?} is not a digest (algorithm:hex, e.g. sha256:…)"
                    ));
                }
                (name, Some(digest.to_string()))
            }
            None => (text, None),
        };
        // A tag follows the last ':' after the last '/' (a port's ':' comes before a '/').
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &rest[last_slash + i + 1..];
                if !TAG.is_match(tag) {
                    return Err(format!(
                        "{tag:?} is not a tag (letters, digits, '_', '.', '-', at most 128)"
                    ));
                }
                (&rest[..last_slash + i], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if name.len() > MAX_NAME_LEN {
            return Err(format!("the name is longer than {MAX_NAME_LEN} characters"));
        }
        let (domain, path) = match name.split_once('/') {
            // As engines split it: a first component with '.' or ':', or `localhost`, is
            // the registry.
            Some((first, path))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                if !DOMAIN.is_match(first) {
                    return Err(format!("{first:?} is not a registry host[:port]"));
                }
                (Some(first.to_string()), path)
            }
            _ => (None, name),
        };
        if !PATH.is_match(path) {
            return Err(format!(
                "{path:?} is not a repository path (lower-case letters, digits and '.', '_', \
                 '-' between them, components joined by '/')"
            ));
        }
        Ok(ImageRef {
            domain,
            path: path.split('/').map(str::to_string).collect(),
            tag,
            digest,
        })
    }

    /// Whether `allowed` (an entry of `--job-images`) allows this image: its registry must
    /// be the same (or both have none), and then, part by part, an entry ending in `/`
    /// (`registry.example.com/ml/`) allows every repository below that path; an entry that
    /// names a repository allows it with any tag or digest, or only the tag or digest it
    /// gives. `ml/trainer` never allows `ml/trainerx` nor `ml/trainer.evil.example/x`.
    pub fn allowed_by(&self, allowed: &AllowedImages) -> bool {
        if self.domain != allowed.reference.domain {
            return false;
        }
        let prefix = &allowed.reference.path;
        if allowed.below {
            return self.path.len() > prefix.len() && self.path.starts_with(prefix);
        }
        self.path == *prefix
            && allowed
                .reference
                .tag
                .as_ref()
                .is_none_or(|t| self.tag.as_ref() == Some(t))
            && allowed
                .reference
                .digest
                .as_ref()
                .is_none_or(|d| self.digest.as_ref() == Some(d))
    }
}

/// One entry of `--job-images`: a repository (with a tag or digest, or not), or a path that
/// repositories are below (`registry.example.com/ml/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedImages {
    reference: ImageRef,
    /// The entry ended in `/`: repositories below its path.
    below: bool,
}

impl AllowedImages {
    pub fn parse(entry: &str) -> Result<AllowedImages, String> {
        let (text, below) = match entry.strip_suffix('/') {
            Some(path) => (path, true),
            None => (entry, false),
        };
        let reference = ImageRef::parse(text)?;
        if below && (reference.tag.is_some() || reference.digest.is_some()) {
            return Err(format!(
                "{entry:?}: a path ending in '/' has no tag or digest"
            ));
        }
        Ok(AllowedImages { reference, below })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_into_their_parts() {
        let r = ImageRef::parse("registry.example.com:5000/ml/trainer:1.4").expect("parse");
        assert_eq!(r.domain.as_deref(), Some("registry.example.com:5000"));
        assert_eq!(r.path, ["ml", "trainer"]);
        assert_eq!(r.tag.as_deref(), Some("1.4"));
        let r = ImageRef::parse("localhost/augur-base:bookworm").expect("parse");
        assert_eq!(r.domain.as_deref(), Some("localhost"));
        let r = ImageRef::parse("debian").expect("parse");
        assert_eq!(
            (r.domain, r.path, r.tag),
            (None, vec!["debian".into()], None)
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        let r = ImageRef::parse(&format!("docker.io/library/python:3.12@{digest}")).expect("parse");
        assert_eq!(r.digest.as_deref(), Some(digest.as_str()));
        assert_eq!(r.tag.as_deref(), Some("3.12"));
    }

    #[test]
    fn engine_flags_and_other_text_are_not_references() {
        for bad in [
            "--privileged --volume=/:/host --user=0:0 docker.io/library/debian",
            "--privileged",
            "-v/:/host",
            "debian --privileged",
            "Debian",
            "ml//trainer",
            "ml/trainer:",
            "ml/trainer@sha256:abc",
            "registry.example.com:port/x",
            "a b",
            "",
            "ml/trainer:-tag",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    fn allows(entry: &str, image: &str) -> bool {
        ImageRef::parse(image)
            .expect("image")
            .allowed_by(&AllowedImages::parse(entry).expect("entry"))
    }

    #[test]
    fn allowed_images_match_by_parts_not_by_text() {
        assert!(allows("allowed/image", "allowed/image:1"));
        assert!(allows("allowed/image", "allowed/image"));
        assert!(!allows("allowed/image", "allowed/imagex:1"));
        assert!(!allows("allowed/image", "allowed/image.evil.example/x"));
        assert!(!allows("allowed/image", "allowed/image/sub"));
        assert!(allows(
            "registry.example.com/ml/",
            "registry.example.com/ml/t:1"
        ));
        assert!(allows(
            "registry.example.com/ml/",
            "registry.example.com/ml/team/t"
        ));
        assert!(!allows(
            "registry.example.com/ml/",
            "registry.example.com/mlx/t:1"
        ));
        assert!(!allows(
            "registry.example.com/ml/",
            "registry.example.com/ml"
        ));
        assert!(!allows(
            "registry.example.com/ml/",
            "evil.example/registry.example.com/ml/t"
        ));
        assert!(!allows(
            "registry.example.com/ml/",
            "registry.example.com.evil.example/ml/t"
        ));
        // A tag or digest in the entry pins it.
        assert!(allows("ml/t:1", "ml/t:1"));
        assert!(!allows("ml/t:1", "ml/t:2"));
        // An unqualified name is not the same as a qualified one: engines resolve short
        // names through their own search lists.
        assert!(!allows("docker.io/library/debian", "debian"));
        assert!(!allows("debian", "docker.io/library/debian"));
        assert!(AllowedImages::parse("ml/t:1/").is_err());
    }
}
