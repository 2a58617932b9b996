//! The target server's migration of one guest in: a page-stream listener
//! for this migration alone (its address and a random ticket go to the
//! client, which hands them to the source), the image received and checked,
//! the restorer turned into the guest ([`super::restore`]), and, lazily,
//! the fault service that runs until every page arrived.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sidecore_wire::mx_image::{MxImage, Record};

use super::Error;
use super::restore::{self, Installed};
use super::restorer;
use super::stream::{PageReader, PageWriter, STREAM_TIMEOUT};
use super::tracee::Tracee;
use super::transfer::{self, LazyTarget};

/// How long the source may take to connect once the client was told where.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);

/// A listener waiting for one source.
pub struct Incoming {
    listener: TcpListener,
    pub ticket: u64,
    pub session: u64,
}

/// A random ticket (the source must show it).
fn ticket() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        b = (t ^ u64::from(std::process::id())).to_le_bytes();
    }
    u64::from_le_bytes(b).max(1)
}

impl Incoming {
    /// Listens on `ip` (the address the client reached this node at).
    pub fn listen(ip: std::net::IpAddr, session: u64) -> Result<Incoming, Error> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|source| Error::Os {
            what: format!("listen for the page stream on {ip}"),
            source,
        })?;
        Ok(Incoming {
            listener,
            ticket: ticket(),
            session,
        })
    }

    /// `ip:port` for the source.
    #[must_use]
    pub fn addr(&self) -> String {
        self.listener
            .local_addr()
            .map_or_else(|_| String::new(), |a| a.to_string())
    }

    /// Waits for the source (closing connections without the ticket) and
    /// reads its image.
    pub fn accept(&self, stop: &dyn Fn() -> bool) -> Result<Arrived, Error> {
        let deadline = Instant::now() + ACCEPT_TIMEOUT;
        self.listener
            .set_nonblocking(true)
            .map_err(|source| Error::Os {
                what: "page-stream listener".into(),
                source,
            })?;
        loop {
            if stop() || Instant::now() > deadline {
                return Err(Error::Refused(
                    "the source never sent the guest's image".into(),
                ));
            }
            match self.listener.accept() {
                Ok((s, from)) => match self.hello(s, from) {
                    Ok(a) => return Ok(a),
                    Err(e) => tracing::info!("page stream from {from}: {e}"),
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => {
                    return Err(Error::Os {
                        what: "accept the page stream".into(),
                        source,
                    });
                }
            }
        }
    }

    fn hello(&self, s: TcpStream, from: SocketAddr) -> Result<Arrived, Error> {
        let peer = format!("the source {from}");
        let os = |source| Error::Os {
            what: format!("page stream from {from}"),
            source,
        };
        s.set_nonblocking(false).map_err(os)?;
        s.set_read_timeout(Some(STREAM_TIMEOUT)).map_err(os)?;
        let _ = s.set_nodelay(true);
        let mut writer = PageWriter::new(s.try_clone().map_err(os)?, &peer)?;
        match self.image(s, &peer) {
            Ok((image, reader)) => Ok(Arrived {
                image: Arc::new(image),
                reader,
                writer,
            }),
            Err(e) => {
                // The sender learns what was wrong, with its own name in it.
                let _ = writer.send(&Record::Error(e.to_string()));
                Err(e)
            }
        }
    }

    fn image(&self, s: TcpStream, peer: &str) -> Result<(MxImage, PageReader), Error> {
        let mut reader = PageReader::new(s, peer)?;
        let bad = |what: String| Error::Peer {
            peer: peer.to_string(),
            what,
        };
        match reader.next_record()? {
            Record::Hello { ticket, session }
                if ticket == self.ticket && session == self.session => {}
            Record::Hello { .. } => return Err(bad("showed the wrong ticket or session".into())),
            other => return Err(bad(format!("opened with `{}`", other.kind().name()))),
        }
        match reader.next_record()? {
            Record::Image(i) => Ok((*i, reader)),
            other => Err(bad(format!(
                "sent `{}` where the image was due",
                other.kind().name()
            ))),
        }
    }
}

/// The image and the stream it came on.
pub struct Arrived {
    pub image: Arc<MxImage>,
    pub reader: PageReader,
    pub writer: PageWriter,
}

/// Where the restorer waits, and how to reach it.
pub struct RestorerLink<'a> {
    pub pid: i32,
    /// The server's end of the container's control socket.
    pub ctl: RawFd,
    /// Waits for the restorer's `installed …` report.
    pub installed: &'a dyn Fn() -> Result<String, Error>,
    pub uffd: Option<OwnedFd>,
}

/// A restored guest.
pub struct Restored {
    pub bytes: u64,
    pub lazy: Option<Arc<LazyTarget>>,
    pub arrived: Arrived,
}

/// Turns the restorer into the image's guest and lets it run; tells the
/// source (`restored`), or sends it the error.
pub fn restore(mut a: Arrived, link: RestorerLink<'_>) -> Result<Restored, Error> {
    match restore_inner(&mut a, link) {
        Ok((bytes, lazy)) => {
            a.writer.send(&Record::Restored)?;
            Ok(Restored {
                bytes,
                lazy,
                arrived: a,
            })
        }
        Err(e) => {
            let _ = a.writer.send(&Record::Error(format!(
                "the target could not restore the guest: {e}"
            )));
            Err(e)
        }
    }
}

fn restore_inner(
    a: &mut Arrived,
    link: RestorerLink<'_>,
) -> Result<(u64, Option<Arc<LazyTarget>>), Error> {
    let image = Arc::clone(&a.image);
    let root = File::open(format!("/proc/{}/root", link.pid)).map_err(|source| Error::Os {
        what: "the guest's root".into(),
        source,
    })?;
    let files = restore::open_files(&root, &image)?;
    let maps: Vec<OwnedFd> = files
        .maps
        .iter()
        .filter_map(|(_, f)| f.try_clone().ok())
        .collect();
    restorer::send_table(link.ctl, &files.fds, &maps, files.exe.as_ref()).map_err(|source| {
        Error::Os {
            what: "hand the descriptors to the restorer".into(),
            source,
        }
    })?;
    let text = (link.installed)()?;
    let (ctl, exe, nums) = restorer::parse_installed(&text)
        .ok_or_else(|| Error::Refused(format!("the restorer said {text:?}")))?;
    let inst = Installed {
        ctl,
        exe,
        maps: files
            .maps
            .iter()
            .map(|(p, _)| p.clone())
            .zip(nums)
            .collect(),
    };
    let mut t = Tracee::seize(link.pid)?;
    restore::map_space(&mut t, &image, &inst)?;
    let (bytes, got) = transfer::receive_pages(&t, &image, &mut a.reader)?;
    restore::finish(&mut t, &image, &inst)?;
    let lazy = match (image.lazy, link.uffd) {
        (true, Some(u)) => Some(LazyTarget::register(u, Arc::clone(&image), &got)?),
        (true, None) => {
            return Err(Error::Refused(
                "a lazy migration without a userfaultfd".into(),
            ));
        }
        _ => None,
    };
    t.detach()?;
    Ok((bytes, lazy))
}

/// Lazily: serves faults and copies pages in until every one arrived (or
/// the source went away, which leaves the guest unable to go on: it is
/// killed). Returns the bytes that arrived lazily.
pub fn finish_lazy(lazy: &Arc<LazyTarget>, arrived: Arrived, guest: i32) -> Result<u64, Error> {
    let Arrived {
        mut reader, writer, ..
    } = arrived;
    let writer = std::sync::Mutex::new(writer);
    let result = std::thread::scope(|s| {
        let l = Arc::clone(lazy);
        let w = &writer;
        s.spawn(move || {
            l.faults(&|addr, pages| {
                w.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .send(&Record::Want { addr, pages })
            });
        });
        let r = (|| {
            while !lazy.done() {
                match reader.next_record()? {
                    Record::Pages { addr, data } => {
                        lazy.arrived(addr, &data);
                    }
                    Record::End if lazy.remaining() > 0 => {
                        return Err(Error::Peer {
                            peer: reader.peer.clone(),
                            what: format!("ended with {} pages still missing", lazy.remaining()),
                        });
                    }
                    Record::End => break,
                    other => {
                        return Err(Error::Peer {
                            peer: reader.peer.clone(),
                            what: format!("sent `{}` among lazy pages", other.kind().name()),
                        });
                    }
                }
            }
            Ok(())
        })();
        if r.is_err() {
            // The guest's memory cannot be completed: it may not run on.
            // SAFETY: kill with a PID and a signal.
            unsafe { libc::kill(guest, libc::SIGKILL) };
        }
        lazy.finish_now();
        r
    });
    result?;
    writer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send(&Record::Resident)?;
    Ok(lazy.stats.bytes.load(std::sync::atomic::Ordering::Relaxed))
}
