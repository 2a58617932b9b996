//! XDR (RFC 4506) primitives: a bounds-checked decoder over a byte slice, an encoder,
//! the [`Xdr`] trait every wire type implements, and the macros that define structs,
//! enums and procedure tables with it.
//!
//! Hand-rolled rather than taken from `xdr-codec` or `serde-xdr`: both are unmaintained,
//! neither reports *where* a message was malformed (byte offset and field path), and a
//! middlebox must check every length against the bytes actually left before it
//! allocates, and against protocol maxima such as `NFS3_FHSIZE`. The decoder is strict
//! (padding must be zero, booleans 0 or 1, enums known), so any accepted input
//! re-encodes to exactly the same bytes.

use std::fmt;

/// What was malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdrErrorKind {
    #[error("truncated: needed {needed} bytes, {remaining} remain")]
    Truncated { needed: usize, remaining: usize },
    #[error("length {len} exceeds the maximum {max}")]
    TooLong { len: u32, max: usize },
    #[error("length {len} exceeds the {remaining} bytes remaining")]
    LengthBeyondEnd { len: u32, remaining: usize },
    #[error("{count} elements exceed the maximum {max}")]
    TooManyElements { count: u32, max: usize },
    #[error("unknown {ty} value {value}")]
    BadDiscriminant { ty: &'static str, value: u32 },
    #[error("boolean must be 0 or 1, got {0}")]
    BadBool(u32),
    #[error("non-zero padding")]
    NonZeroPadding,
    #[error("{0} unexpected trailing bytes")]
    TrailingBytes(usize),
}

/// A malformed XDR item: what went wrong, at which byte offset, and inside which
/// fields (outermost first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdrError {
    /// Byte offset from the start of the decoded buffer.
    pub offset: usize,
    pub kind: XdrErrorKind,
    /// Field path, innermost first (see `Display` for the readable order).
    context: Vec<&'static str>,
}

impl XdrError {
    pub fn new(offset: usize, kind: XdrErrorKind) -> Self {
        Self {
            offset,
            kind,
            context: Vec::new(),
        }
    }

    /// Adds an enclosing field name.
    #[must_use]
    pub fn within(mut self, field: &'static str) -> Self {
        self.context.push(field);
        self
    }

    /// The field path, outermost first, e.g. `WRITE3args.file.data`.
    pub fn path(&self) -> String {
        let mut parts: Vec<&str> = self.context.clone();
        parts.reverse();
        parts.join(".")
    }
}

impl fmt::Display for XdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "malformed XDR at byte {}: {}", self.offset, self.kind)
        } else {
            write!(
                f,
                "malformed XDR at byte {} in {}: {}",
                self.offset,
                self.path(),
                self.kind
            )
        }
    }
}

impl std::error::Error for XdrError {}

pub type XdrResult<T> = Result<T, XdrError>;

/// Bounds-checked reader over one buffer.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Added to positions in errors, for a decoder over a slice of a larger buffer.
    base: usize,
}

fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            base: 0,
        }
    }

    /// A decoder whose error offsets are shifted by `base`.
    pub fn with_base(buf: &'a [u8], base: usize) -> Self {
        Self { buf, pos: 0, base }
    }

    pub fn offset(&self) -> usize {
        self.base + self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The undecoded rest of the buffer.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    pub fn error(&self, kind: XdrErrorKind) -> XdrError {
        XdrError::new(self.offset(), kind)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> XdrResult<()> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.error(XdrErrorKind::TrailingBytes(n))),
        }
    }

    fn take(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        let remaining = self.remaining();
        if n > remaining {
            return Err(self.error(XdrErrorKind::Truncated {
                needed: n,
                remaining,
            }));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn u32(&mut self) -> XdrResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> XdrResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    pub fn bool(&mut self) -> XdrResult<bool> {
        let at = self.offset();
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::new(at, XdrErrorKind::BadBool(v))),
        }
    }

    fn padding(&mut self, len: usize) -> XdrResult<()> {
        let at = self.offset();
        if self.take(pad(len))?.iter().any(|&b| b != 0) {
            return Err(XdrError::new(at, XdrErrorKind::NonZeroPadding));
        }
        Ok(())
    }

    /// Fixed-length opaque of `N` bytes (plus padding).
    pub fn fixed<const N: usize>(&mut self) -> XdrResult<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        self.padding(N)?;
        Ok(out)
    }

    /// Variable-length opaque or string of at most `max` bytes. The length is checked
    /// against `max` and against the bytes remaining before anything is copied.
    pub fn opaque(&mut self, max: usize) -> XdrResult<&'a [u8]> {
        let at = self.offset();
        let len = self.u32()?;
        if len as usize > max {
            return Err(XdrError::new(at, XdrErrorKind::TooLong { len, max }));
        }
        let remaining = self.remaining();
        if len as usize > remaining {
            return Err(XdrError::new(
                at,
                XdrErrorKind::LengthBeyondEnd { len, remaining },
            ));
        }
        let data = self.take(len as usize)?;
        self.padding(len as usize)?;
        Ok(data)
    }

    /// A counted array of at most `max` elements. Capacity is reserved only for what the
    /// remaining bytes could hold (every element is at least 4 bytes).
    pub fn array<T: Xdr>(&mut self, max: usize) -> XdrResult<Vec<T>> {
        let at = self.offset();
        let count = self.u32()?;
        if count as usize > max {
            return Err(XdrError::new(
                at,
                XdrErrorKind::TooManyElements { count, max },
            ));
        }
        let mut out = Vec::with_capacity((count as usize).min(self.remaining() / 4));
        for _ in 0..count {
            out.push(T::decode(self)?);
        }
        Ok(out)
    }

    /// An XDR linked list (`T *next` chains, as in READDIR and EXPORT), decoded
    /// iteratively so a long list cannot exhaust the stack.
    pub fn list<T: Xdr>(&mut self) -> XdrResult<Vec<T>> {
        let mut out = Vec::new();
        while self.bool()? {
            out.push(T::decode(self)?);
        }
        Ok(out)
    }

    /// Decodes one field, naming it in any error.
    pub fn field<T: Xdr>(&mut self, name: &'static str) -> XdrResult<T> {
        T::decode(self).map_err(|e| e.within(name))
    }
}

/// Appends XDR to a byte vector.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    /// Room for a header and small results without growing; larger
    /// messages (READ and WRITE data) grow it once or twice.
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(512),
        }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.u32(u32::from(v));
    }

    pub fn fixed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        self.buf.extend(std::iter::repeat_n(0u8, pad(data.len())));
    }

    /// Variable-length opaque. Lengths beyond `u32::MAX` cannot occur for the bounded
    /// types of this crate; the length is saturated rather than wrapped.
    pub fn opaque(&mut self, data: &[u8]) {
        self.u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
        self.fixed(data);
    }

    pub fn array<T: Xdr>(&mut self, items: &[T]) {
        self.u32(u32::try_from(items.len()).unwrap_or(u32::MAX));
        for item in items {
            item.encode(self);
        }
    }

    pub fn list<T: Xdr>(&mut self, items: &[T]) {
        for item in items {
            self.bool(true);
            item.encode(self);
        }
        self.bool(false);
    }
}

/// A type with an XDR representation.
pub trait Xdr: Sized {
    fn encode(&self, enc: &mut Encoder);
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self>;

    fn to_xdr(&self) -> Vec<u8> {
        let mut enc = Encoder::new();
        self.encode(&mut enc);
        enc.into_bytes()
    }

    /// Decodes a whole buffer; trailing bytes are an error.
    fn from_xdr(bytes: &[u8]) -> XdrResult<Self> {
        let mut dec = Decoder::new(bytes);
        let v = Self::decode(&mut dec)?;
        dec.finish()?;
        Ok(v)
    }
}

impl Xdr for () {
    fn encode(&self, _: &mut Encoder) {}
    fn decode(_: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(())
    }
}

impl Xdr for u32 {
    fn encode(&self, enc: &mut Encoder) {
        enc.u32(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        dec.u32()
    }
}

impl Xdr for u64 {
    fn encode(&self, enc: &mut Encoder) {
        enc.u64(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        dec.u64()
    }
}

impl Xdr for bool {
    fn encode(&self, enc: &mut Encoder) {
        enc.bool(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        dec.bool()
    }
}

impl Xdr for [u8; 8] {
    fn encode(&self, enc: &mut Encoder) {
        enc.fixed(self);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        dec.fixed::<8>()
    }
}

/// `opaque<>` / `string<>` with no protocol maximum (bounded by the message itself).
impl Xdr for Vec<u8> {
    fn encode(&self, enc: &mut Encoder) {
        enc.opaque(self);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        Ok(dec.opaque(u32::MAX as usize)?.to_vec())
    }
}

/// XDR optional data (`T *`, or a `bool`-discriminated union with a void arm).
impl<T: Xdr> Xdr for Option<T> {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            None => enc.bool(false),
            Some(v) => {
                enc.bool(true);
                v.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        if dec.bool()? {
            Ok(Some(T::decode(dec)?))
        } else {
            Ok(None)
        }
    }
}

/// An XDR linked list (`mountlist`, `exports`) as a vector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List<T>(pub Vec<T>);

impl<T: Xdr> Xdr for List<T> {
    fn encode(&self, enc: &mut Encoder) {
        enc.list(&self.0);
    }
    fn decode(dec: &mut Decoder<'_>) -> XdrResult<Self> {
        dec.list().map(List)
    }
}

#[cfg(test)]
impl<T: proptest::arbitrary::Arbitrary + 'static> proptest::arbitrary::Arbitrary for List<T> {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop::collection::vec(any::<T>(), 0..5)
            .prop_map(List)
            .boxed()
    }
}

/// Defines a struct whose XDR form is its fields in order; errors name `Type.field`.
macro_rules! xdr_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }

        impl $crate::xdr::Xdr for $name {
            fn encode(&self, enc: &mut $crate::xdr::Encoder) {
                $($crate::xdr::Xdr::encode(&self.$field, enc);)*
            }
            fn decode(dec: &mut $crate::xdr::Decoder<'_>) -> $crate::xdr::XdrResult<Self> {
                Ok(Self { $($field: dec.field(concat!(stringify!($name), ".", stringify!($field)))?),* })
            }
        }

        #[cfg(test)]
        impl proptest::arbitrary::Arbitrary for $name {
            type Parameters = ();
            type Strategy = proptest::strategy::BoxedStrategy<Self>;
            fn arbitrary_with(_: ()) -> Self::Strategy {
                use proptest::strategy::Strategy;
                $crate::xdr::nest_strategy!($($ty),*)
                    .prop_map(|$crate::xdr::nest_pattern!($($field),*)| Self { $($field),* })
                    .boxed()
            }
        }
    };
}
pub(crate) use xdr_struct;

/// Nested pair strategies, so structs with more than twelve fields still get one.
#[cfg(test)]
macro_rules! nest_strategy {
    () => { proptest::strategy::Just(()) };
    ($t:ty $(, $rest:ty)*) => { (proptest::arbitrary::any::<$t>(), $crate::xdr::nest_strategy!($($rest),*)) };
}
#[cfg(test)]
pub(crate) use nest_strategy;

#[cfg(test)]
macro_rules! nest_pattern {
    () => { () };
    ($f:ident $(, $rest:ident)*) => { ($f, $crate::xdr::nest_pattern!($($rest),*)) };
}
#[cfg(test)]
pub(crate) use nest_pattern;

/// Defines a C-like XDR enum; an unknown value is a `BadDiscriminant` error.
macro_rules! xdr_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $variant:ident = $value:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $variant),* }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn to_u32(self) -> u32 {
                match self { $($name::$variant => $value),* }
            }

            pub fn from_u32(v: u32) -> Option<Self> {
                match v { $($value => Some($name::$variant),)* _ => None }
            }
        }

        impl $crate::xdr::Xdr for $name {
            fn encode(&self, enc: &mut $crate::xdr::Encoder) {
                enc.u32(self.to_u32());
            }
            fn decode(dec: &mut $crate::xdr::Decoder<'_>) -> $crate::xdr::XdrResult<Self> {
                let at = dec.offset();
                let v = dec.u32()?;
                Self::from_u32(v).ok_or_else(|| $crate::xdr::XdrError::new(
                    at,
                    $crate::xdr::XdrErrorKind::BadDiscriminant { ty: stringify!($name), value: v },
                ))
            }
        }

        #[cfg(test)]
        impl proptest::arbitrary::Arbitrary for $name {
            type Parameters = ();
            type Strategy = proptest::strategy::BoxedStrategy<Self>;
            fn arbitrary_with(_: ()) -> Self::Strategy {
                use proptest::strategy::Strategy;
                proptest::sample::select($name::ALL).boxed()
            }
        }
    };
}
pub(crate) use xdr_enum;

/// Defines one RPC program version's procedure table: the procedure enum, a call enum
/// (one variant per procedure carrying its arguments) and a reply enum (its results),
/// with decoding by procedure number.
macro_rules! rpc_procedures {
    ($(#[$m:meta])* $proc:ident, $call:ident, $reply:ident, $label:literal {
        $($variant:ident = $num:literal : $args:ty => $res:ty),* $(,)?
    }) => {
        $crate::xdr::xdr_enum! {
            $(#[$m])*
            pub enum $proc { $($variant = $num),* }
        }

        #[doc = concat!("The arguments of a ", $label, " call, by procedure.")]
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum $call { $($variant($args)),* }

        #[doc = concat!("The results of a ", $label, " reply, by procedure.")]
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum $reply { $($variant($res)),* }

        impl $call {
            pub fn procedure(&self) -> $proc {
                match self { $($call::$variant(_) => $proc::$variant),* }
            }
            pub fn encode(&self, enc: &mut $crate::xdr::Encoder) {
                match self { $($call::$variant(a) => $crate::xdr::Xdr::encode(a, enc)),* }
            }
            /// Decodes the arguments of `procedure`; errors name the procedure.
            pub fn decode(procedure: $proc, dec: &mut $crate::xdr::Decoder<'_>) -> $crate::xdr::XdrResult<Self> {
                match procedure {
                    $($proc::$variant => dec
                        .field(concat!($label, " ", stringify!($variant), " args"))
                        .map($call::$variant),)*
                }
            }
        }

        impl $reply {
            pub fn procedure(&self) -> $proc {
                match self { $($reply::$variant(_) => $proc::$variant),* }
            }
            pub fn encode(&self, enc: &mut $crate::xdr::Encoder) {
                match self { $($reply::$variant(r) => $crate::xdr::Xdr::encode(r, enc)),* }
            }
            /// Decodes the results of `procedure` (known from the pending call).
            pub fn decode(procedure: $proc, dec: &mut $crate::xdr::Decoder<'_>) -> $crate::xdr::XdrResult<Self> {
                match procedure {
                    $($proc::$variant => dec
                        .field(concat!($label, " ", stringify!($variant), " results"))
                        .map($reply::$variant),)*
                }
            }
        }

        #[cfg(test)]
        impl proptest::arbitrary::Arbitrary for $call {
            type Parameters = ();
            type Strategy = proptest::strategy::BoxedStrategy<Self>;
            fn arbitrary_with(_: ()) -> Self::Strategy {
                use proptest::strategy::Strategy;
                proptest::strategy::Union::new(vec![
                    $(proptest::arbitrary::any::<$args>().prop_map($call::$variant).boxed()),*
                ]).boxed()
            }
        }

        #[cfg(test)]
        impl proptest::arbitrary::Arbitrary for $reply {
            type Parameters = ();
            type Strategy = proptest::strategy::BoxedStrategy<Self>;
            fn arbitrary_with(_: ()) -> Self::Strategy {
                use proptest::strategy::Strategy;
                proptest::strategy::Union::new(vec![
                    $(proptest::arbitrary::any::<$res>().prop_map($reply::$variant).boxed()),*
                ]).boxed()
            }
        }
    };
}
pub(crate) use rpc_procedures;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_length_is_checked_before_copying() {
        // Claims 0xFFFF_FFF0 bytes with 4 present: an error, not an allocation.
        let bytes = [0xFF, 0xFF, 0xFF, 0xF0, 1, 2, 3, 4];
        let err = Decoder::new(&bytes).opaque(usize::MAX).unwrap_err();
        assert_eq!(err.offset, 0);
        assert!(matches!(
            err.kind,
            XdrErrorKind::LengthBeyondEnd {
                len: 0xFFFF_FFF0,
                remaining: 4
            }
        ));
    }

    #[test]
    fn padding_must_be_zero() {
        let bytes = [0, 0, 0, 1, 7, 0, 1, 0];
        let err = Decoder::new(&bytes).opaque(10).unwrap_err();
        assert_eq!(err.kind, XdrErrorKind::NonZeroPadding);
        assert_eq!(err.offset, 5);
    }

    #[test]
    fn errors_name_the_field_path() {
        let e = XdrError::new(12, XdrErrorKind::BadBool(7))
            .within("inner")
            .within("Outer.f");
        assert_eq!(
            e.to_string(),
            "malformed XDR at byte 12 in Outer.f.inner: boolean must be 0 or 1, got 7"
        );
    }
}
