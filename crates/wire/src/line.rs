//! The control socket's framing: one JSON object per line (so that `socat` and
//! a shell can talk to a daemon), read through one bounded reader. The node
//! protocol uses binary frames ([`crate::frame`]); this is the only other
//! reader of protocol bytes in sidecore.

use std::io::{self, BufRead, ErrorKind};

/// Longest control-socket line either side reads, newline included.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Reads one line of at most [`MAX_LINE_BYTES`] bytes, without its newline.
/// `Ok(None)` on a clean end of stream; an error for a longer line, a line that
/// is not UTF-8, or a stream that ends in the middle of a line.
pub fn read_line(r: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("the stream ended inside a line ({} bytes)", buf.len()),
                ))
            };
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        buf.extend_from_slice(&avail[..take]);
        r.consume(take);
        if buf.len() > MAX_LINE_BYTES {
            return Err(io::Error::new(
                ErrorKind::InvalidData,
                format!("line longer than {MAX_LINE_BYTES} bytes"),
            ));
        }
        if done {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return String::from_utf8(buf)
                .map(Some)
                .map_err(|_| io::Error::new(ErrorKind::InvalidData, "line is not UTF-8"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    #[test]
    fn lines_limits_and_bad_bytes() {
        let mut r = BufReader::with_capacity(3, &b"{\"op\":\"ps\"}\r\nsecond\n"[..]);
        assert_eq!(
            read_line(&mut r).unwrap().as_deref(),
            Some("{\"op\":\"ps\"}")
        );
        assert_eq!(read_line(&mut r).unwrap().as_deref(), Some("second"));
        assert_eq!(read_line(&mut r).unwrap(), None);

        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let e = read_line(&mut &long[..]).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        let e = read_line(&mut &b"\xff\xfe\n"[..]).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        let e = read_line(&mut &b"half"[..]).unwrap_err();
        assert!(e.to_string().contains("ended inside a line"), "{e}");
    }
}
