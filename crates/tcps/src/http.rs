//! HTTP/1.1 request heads for the example file server: `httparse` does the
//! parsing (a well-kept, fuzzed parser); this module adds the limits and the
//! answers — an incomplete head is fine until it exceeds the header limit
//! (431), a malformed one is a 400, a method other than GET/HEAD a 405, and a
//! body (which no GET needs) is refused rather than misread as the next
//! request.

/// Most headers a request may carry.
pub const MAX_HEADERS: usize = 64;

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// The connection stays open after the response.
    pub keep_alive: bool,
    /// Bytes of the head, including the blank line.
    pub head_len: usize,
}

/// Why a request head was refused, with the status it is answered with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("malformed request head: {0}")]
    Malformed(String),
    #[error("request head longer than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("method {0} not allowed (GET and HEAD only)")]
    Method(String),
    #[error("request bodies are not accepted")]
    Body,
}

impl HttpError {
    /// The status line's code and reason.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            HttpError::Malformed(_) => (400, "Bad Request"),
            HttpError::TooLarge { .. } => (431, "Request Header Fields Too Large"),
            HttpError::Method(_) => (405, "Method Not Allowed"),
            HttpError::Body => (413, "Content Too Large"),
        }
    }
}

/// Parses the head at the start of `buf`: `Ok(None)` while it is incomplete
/// and within `max_head` bytes.
pub fn parse(buf: &[u8], max_head: usize) -> Result<Option<Request>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let status = req
        .parse(buf)
        .map_err(|e| HttpError::Malformed(e.to_string()))?;
    let head_len = match status {
        httparse::Status::Partial => {
            if buf.len() > max_head {
                return Err(HttpError::TooLarge { limit: max_head });
            }
            return Ok(None);
        }
        httparse::Status::Complete(n) => n,
    };
    if head_len > max_head {
        return Err(HttpError::TooLarge { limit: max_head });
    }
    let method = req.method.unwrap_or_default().to_string();
    let path = req.path.unwrap_or_default().to_string();
    let minor = req.version.unwrap_or(1);
    let mut keep_alive = minor >= 1;
    for h in req.headers.iter() {
        let name = h.name;
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                keep_alive = false;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                keep_alive = true;
            }
        } else if (name.eq_ignore_ascii_case("content-length") && value != "0")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            return Err(HttpError::Body);
        }
    }
    if method != "GET" && method != "HEAD" {
        return Err(HttpError::Method(method));
    }
    Ok(Some(Request {
        method,
        path,
        minor,
        keep_alive,
        head_len,
    }))
}

/// A response head.
pub fn head(code: u16, reason: &str, len: usize, keep_alive: bool, content_type: &str) -> String {
    format!(
        "HTTP/1.1 {code} {reason}\r\nServer: sidecore-tcps\r\nContent-Length: {len}\r\nContent-Type: {content_type}\r\nConnection: {}\r\n\r\n",
        if keep_alive { "keep-alive" } else { "close" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let r = parse(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", 8192)
            .expect("valid")
            .expect("complete");
        assert_eq!(
            (r.path.as_str(), r.keep_alive, r.head_len),
            ("/a", true, 28)
        );
        let r = parse(b"GET / HTTP/1.0\r\n\r\n", 8192)
            .expect("valid")
            .expect("complete");
        assert!(!r.keep_alive);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHo", 8192), Ok(None));
        assert!(matches!(
            parse(b"G\0T / HTTP/1.1\r\n\r\n", 8192),
            Err(HttpError::Malformed(_))
        ));
        // A method token that has not ended yet is just incomplete…
        assert_eq!(parse(&[b'a'; 100], 8192), Ok(None));
        // …until the head limit.
        assert!(matches!(
            parse(&[b'a'; 100], 64),
            Err(HttpError::TooLarge { limit: 64 })
        ));
        assert!(matches!(
            parse(b"HELLO\r\n\r\n", 8192),
            Err(HttpError::Malformed(_))
        ));
        let long = format!("GET / HTTP/1.1\r\nX: {}", "y".repeat(9000));
        assert_eq!(
            parse(long.as_bytes(), 8192),
            Err(HttpError::TooLarge { limit: 8192 })
        );
        assert!(matches!(
            parse(b"POST / HTTP/1.1\r\n\r\n", 8192),
            Err(HttpError::Method(_))
        ));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 8192),
            Err(HttpError::Body)
        );
    }
}
