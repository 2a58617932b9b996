//! The Virtual Control Namespace's objects (§4.5.2, Fig. 4.6), sans-IO: the
//! virtual file handles the RBAC policy gives every object, the fixed tree under
//! `/.filewall`, and the attributes and directory entries it shows for them.
//!
//! Every handle the RBAC policy returns is *virtual* and tagged by its first byte,
//! so no virtual object can collide with a server's handle:
//! - `R` + the server's handle: a real object (at most 63 bytes of it);
//! - `V` + node kind + index (2 bytes) + the export root's handle: a fixed node of
//!   the VCN (`/.filewall`, `users`, `roles`, their `ctrl` files and entries,
//!   `log`);
//! - `S` + a real object's handle: its shadow under `/.filewall/shadow` (the
//!   shadow of the root is the `shadow` directory itself).
//!
//! Handles of real objects carry no state, so they stay valid across restarts; a
//! handle without a known tag is refused (NFS3ERR_BADHANDLE).
//!
//! ```text
//! /.filewall/
//!     users/ctrl  users/<name>...   user assignment; administrators write commands
//!     roles/ctrl  roles/<name>...   your session; write role names to activate them
//!     log                           LOG and ALARM events (administrators)
//!     shadow/...                    mirrors the export; a file shows its permissions
//! ```

use crate::nfs3::{Fattr3, Ftype3, NFS3_FHSIZE, NfsTime3, SpecData3};

pub const TAG_REAL: u8 = b'R';
pub const TAG_NODE: u8 = b'V';
pub const TAG_SHADOW: u8 = b'S';
/// The longest server handle a virtual one can carry.
pub const MAX_REAL: usize = NFS3_FHSIZE - 1;
/// The VCN's name in the export root.
pub const VCN_NAME: &[u8] = b".filewall";
/// The READDIR cookie of the `.filewall` entry appended to root listings.
pub const VCN_COOKIE: u64 = 0x7fff_ffff_ffff_fff0;
/// The file system id VCN objects report.
pub const VCN_FSID: u64 = 0x4657_4c4c;

/// A fixed node of the VCN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// `/.filewall`
    Top,
    Users,
    Roles,
    UsersCtrl,
    RolesCtrl,
    Log,
    User(u16),
    Role(u16),
}

impl Node {
    fn code(self) -> (u8, u16) {
        match self {
            Node::Top => (0, 0),
            Node::Users => (1, 0),
            Node::Roles => (2, 0),
            Node::UsersCtrl => (3, 0),
            Node::RolesCtrl => (4, 0),
            Node::Log => (5, 0),
            Node::User(i) => (6, i),
            Node::Role(i) => (7, i),
        }
    }

    fn from_code(kind: u8, i: u16) -> Option<Node> {
        Some(match (kind, i) {
            (0, 0) => Node::Top,
            (1, 0) => Node::Users,
            (2, 0) => Node::Roles,
            (3, 0) => Node::UsersCtrl,
            (4, 0) => Node::RolesCtrl,
            (5, 0) => Node::Log,
            (6, i) => Node::User(i),
            (7, i) => Node::Role(i),
            _ => return None,
        })
    }

    pub fn is_dir(self) -> bool {
        matches!(self, Node::Top | Node::Users | Node::Roles)
    }

    /// Whether clients may WRITE it.
    pub fn writable(self) -> bool {
        matches!(self, Node::UsersCtrl | Node::RolesCtrl)
    }
}

/// A virtual file handle, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Vfh {
    Real(Vec<u8>),
    Node { node: Node, root: Vec<u8> },
    Shadow(Vec<u8>),
}

impl Vfh {
    /// Its bytes, or `None` if the server handle inside is too long.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let (mut v, rest): (Vec<u8>, &[u8]) = match self {
            Vfh::Real(fh) => (vec![TAG_REAL], fh),
            Vfh::Shadow(fh) => (vec![TAG_SHADOW], fh),
            Vfh::Node { node, root } => {
                let (k, i) = node.code();
                let [hi, lo] = i.to_be_bytes();
                (vec![TAG_NODE, k, hi, lo], root)
            }
        };
        if v.len() + rest.len() > NFS3_FHSIZE {
            return None;
        }
        v.extend_from_slice(rest);
        Some(v)
    }

    /// The handle `bytes` names, or `None` if FileWall did not make it.
    pub fn decode(bytes: &[u8]) -> Option<Vfh> {
        let (&tag, rest) = bytes.split_first()?;
        match tag {
            TAG_REAL => Some(Vfh::Real(rest.to_vec())),
            TAG_SHADOW => Some(Vfh::Shadow(rest.to_vec())),
            TAG_NODE if rest.len() >= 3 => {
                let node = Node::from_code(rest[0], u16::from_be_bytes([rest[1], rest[2]]))?;
                Some(Vfh::Node {
                    node,
                    root: rest[3..].to_vec(),
                })
            }
            _ => None,
        }
    }

    /// A file id for a virtual object: a hash of its handle, high bit set so it
    /// differs from the server's ids in practice.
    pub fn fileid(&self) -> u64 {
        // FNV-1a: stable across runs, which a hash map's hasher is not.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.encode().unwrap_or_default() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h | 1 << 63
    }
}

/// Attributes of a virtual object.
pub fn attrs(
    v: &Vfh,
    dir: bool,
    mode: u32,
    owner: (u32, u32),
    size: u64,
    generation: u32,
) -> Fattr3 {
    let t = NfsTime3 {
        seconds: 1_700_000_000u32.wrapping_add(generation),
        nseconds: 0,
    };
    Fattr3 {
        ftype: if dir { Ftype3::Dir } else { Ftype3::Reg },
        mode,
        nlink: if dir { 2 } else { 1 },
        uid: owner.0,
        gid: owner.1,
        size,
        used: size,
        rdev: SpecData3 {
            specdata1: 0,
            specdata2: 0,
        },
        fsid: VCN_FSID,
        fileid: v.fileid(),
        atime: t.clone(),
        mtime: t.clone(),
        ctime: t,
    }
}

/// The mode bits of a fixed node.
pub fn node_mode(n: Node) -> u32 {
    if n.is_dir() {
        0o555
    } else if n.writable() {
        0o666
    } else {
        0o444
    }
}

/// The children of a fixed directory (`users`, `roles` list the policy's users
/// and roles by name), without `.` and `..`.
pub fn children(n: Node, root: &[u8], users: &[String], roles: &[String]) -> Vec<(Vec<u8>, Vfh)> {
    let node = |node| Vfh::Node {
        node,
        root: root.to_vec(),
    };
    match n {
        Node::Top => vec![
            (b"users".to_vec(), node(Node::Users)),
            (b"roles".to_vec(), node(Node::Roles)),
            (b"log".to_vec(), node(Node::Log)),
            (b"shadow".to_vec(), Vfh::Shadow(root.to_vec())),
        ],
        Node::Users => std::iter::once((b"ctrl".to_vec(), node(Node::UsersCtrl)))
            .chain(
                users
                    .iter()
                    .enumerate()
                    .map(|(i, u)| (u.as_bytes().to_vec(), node(Node::User(i as u16)))),
            )
            .collect(),
        Node::Roles => std::iter::once((b"ctrl".to_vec(), node(Node::RolesCtrl)))
            .chain(
                roles
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.as_bytes().to_vec(), node(Node::Role(i as u16)))),
            )
            .collect(),
        _ => Vec::new(),
    }
}

/// The parent of a fixed node (`..`).
pub fn parent(n: Node, root: &[u8]) -> Vfh {
    let node = |node| Vfh::Node {
        node,
        root: root.to_vec(),
    };
    match n {
        Node::Top => Vfh::Real(root.to_vec()),
        Node::Users | Node::Roles | Node::Log => node(Node::Top),
        Node::UsersCtrl | Node::User(_) => node(Node::Users),
        Node::RolesCtrl | Node::Role(_) => node(Node::Roles),
    }
}

/// A slice of a file's content for READ: the bytes and whether it is the end.
pub fn read_slice(content: &[u8], offset: u64, count: u32) -> (Vec<u8>, bool) {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(content.len());
    let end = start.saturating_add(count as usize).min(content.len());
    (content[start..end].to_vec(), end == content.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_strangers_are_refused() {
        let root = vec![9u8; 24];
        for v in [
            Vfh::Real(vec![1, 2, 3]),
            Vfh::Shadow(root.clone()),
            Vfh::Node {
                node: Node::Role(3),
                root: root.clone(),
            },
            Vfh::Node {
                node: Node::Top,
                root: root.clone(),
            },
        ] {
            let b = v.encode().unwrap();
            assert_eq!(Vfh::decode(&b), Some(v.clone()));
            assert_eq!(v.fileid() >> 63, 1);
        }
        assert_eq!(Vfh::decode(&[]), None);
        assert_eq!(Vfh::decode(&[b'X', 1, 2]), None);
        assert_eq!(Vfh::decode(&[TAG_NODE, 9, 0, 0]), None);
        assert_eq!(Vfh::decode(&[TAG_NODE, 0]), None);
        assert!(Vfh::Real(vec![0; MAX_REAL]).encode().is_some());
        assert!(Vfh::Real(vec![0; MAX_REAL + 1]).encode().is_none());
    }

    #[test]
    fn the_tree_and_reads() {
        let users = vec!["alice".to_string()];
        let roles = vec!["user".to_string(), "admin".to_string()];
        let top = children(Node::Top, b"r", &users, &roles);
        assert_eq!(top.len(), 4);
        assert_eq!(top[3], (b"shadow".to_vec(), Vfh::Shadow(b"r".to_vec())));
        assert_eq!(children(Node::Roles, b"r", &users, &roles).len(), 3);
        assert_eq!(
            parent(Node::RolesCtrl, b"r"),
            Vfh::Node {
                node: Node::Roles,
                root: b"r".to_vec()
            }
        );
        assert_eq!(read_slice(b"hello", 1, 3), (b"ell".to_vec(), false));
        assert_eq!(read_slice(b"hello", 3, 100), (b"lo".to_vec(), true));
        assert_eq!(read_slice(b"hello", 99, 1), (Vec::new(), true));
    }
}
