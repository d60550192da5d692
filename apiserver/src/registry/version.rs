//! resourceVersions that name the process that issued them.
//!
//! The registry is soft state: every kplug process (a restart, another
//! replica) rebuilds it from heartbeats and counts its own changes from 1.
//! A bare counter from one process would mean something else in another, so
//! a watch resumed there could replay the wrong history. Each version is
//! therefore written `EPOCH.COUNTER`, the epoch being random per process: a
//! version from another epoch is recognised and answered with `410 Expired`,
//! on which every client relists. Clients treat resourceVersions as opaque
//! strings, so the form is free to choose.

use std::fmt;
use std::str::FromStr;

/// The identity of one registry's history, random per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch(u32);

impl Epoch {
    pub fn random() -> Self {
        // A v4 UUID's first field is random.
        Self(uuid::Uuid::new_v4().as_fields().0)
    }

    /// This epoch's resourceVersion for the change numbered `counter`.
    pub fn version(self, counter: u64) -> String {
        ResourceVersion {
            epoch: self,
            counter,
        }
        .to_string()
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// A resourceVersion as a client sends it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceVersion {
    pub epoch: Epoch,
    pub counter: u64,
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.counter)
    }
}

/// A resourceVersion kplug cannot have issued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("resourceVersion: Invalid value: {0:?}: must be a resourceVersion kplug returned")]
pub struct InvalidVersion(pub String);

impl FromStr for ResourceVersion {
    type Err = InvalidVersion;

    fn from_str(value: &str) -> Result<Self, InvalidVersion> {
        let invalid = || InvalidVersion(value.to_owned());
        let (epoch, counter) = value.split_once('.').ok_or_else(invalid)?;
        if epoch.len() != 8 {
            return Err(invalid());
        }
        Ok(Self {
            epoch: Epoch(u32::from_str_radix(epoch, 16).map_err(|_| invalid())?),
            counter: counter.parse().map_err(|_| invalid())?,
        })
    }
}

/// A resourceVersion from another epoch: issued by an earlier process or
/// another replica, so nothing can be resumed from it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "too old resource version: {requested} (issued by another kplug process; this one is at \
     epoch {current})"
)]
pub struct ForeignVersion {
    pub requested: String,
    pub current: Epoch,
}

/// What a client's resourceVersion means to this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestedVersion {
    /// One of this process's versions: its change counter.
    Local(u64),
    /// Another process's: the client must relist.
    Foreign(ForeignVersion),
}

impl Epoch {
    /// Places `requested` in this epoch's history. A bare decimal (as kplug
    /// wrote before epochs, or as kube-apiserver writes) is foreign too.
    pub fn place(self, requested: &str) -> Result<RequestedVersion, InvalidVersion> {
        let foreign = || {
            RequestedVersion::Foreign(ForeignVersion {
                requested: requested.to_owned(),
                current: self,
            })
        };
        if !requested.is_empty() && requested.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(foreign());
        }
        let version: ResourceVersion = requested.parse()?;
        Ok(if version.epoch == self {
            RequestedVersion::Local(version.counter)
        } else {
            foreign()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip_and_name_their_epoch() {
        let epoch = Epoch(0x00c0_ffee);
        assert_eq!(epoch.version(42), "00c0ffee.42");
        assert_eq!(epoch.place("00c0ffee.42"), Ok(RequestedVersion::Local(42)));
        let other = Epoch(0xdead_beef);
        assert_eq!(
            other.place("00c0ffee.42"),
            Ok(RequestedVersion::Foreign(ForeignVersion {
                requested: "00c0ffee.42".to_owned(),
                current: other,
            }))
        );
    }

    #[test]
    fn decimal_versions_are_foreign_and_garbage_is_invalid() {
        let epoch = Epoch(1);
        assert!(matches!(
            epoch.place("12345"),
            Ok(RequestedVersion::Foreign(_))
        ));
        for bad in [
            "",
            "abc",
            "00000001.",
            ".5",
            "1.5",
            "0000001.5",
            "00000001.-5",
            "0000000g.5",
            "00000001.5.6",
        ] {
            assert_eq!(
                epoch.place(bad),
                Err(InvalidVersion(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn random_epochs_differ() {
        // Two of 2^32: equal once in four billion runs.
        assert_ne!(Epoch::random(), Epoch::random());
    }
}
