//! The stream channel over real TCP on loopback: order, no loss when reliable,
//! a handshake that names bad peers, a clean close, and a lost connection
//! (closed without the end mark) held open for the grace period.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use sidecore_channel::sender::SendOutcome;
use sidecore_channel::stream::{StreamError, StreamListener, StreamSender};
use sidecore_types::Delivery;

#[test]
fn reliable_stream_delivers_in_order_then_closes() {
    let l = StreamListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let sender = thread::spawn(move || {
        let mut s =
            StreamSender::connect(addr, "records", Delivery::Reliable, Duration::from_secs(5))
                .unwrap();
        for i in 0..100_000u32 {
            let len = (i % 200) as usize;
            let mut m = vec![(i % 251) as u8; len + 4];
            m[..4].copy_from_slice(&i.to_le_bytes());
            assert_eq!(s.send(&m).unwrap(), SendOutcome::Sent);
            if i % 64 == 0 {
                s.publish().unwrap();
            }
        }
        s.publish().unwrap();
    });
    let mut r = l.accept(Duration::from_secs(5)).unwrap();
    r.expect_channel("records").unwrap();
    let mut next = 0u32;
    loop {
        match r.try_recv() {
            Ok(Some(m)) => {
                let i = u32::from_le_bytes(m[..4].try_into().unwrap());
                assert_eq!(i, next, "in order, nothing lost");
                assert_eq!(m.len(), (i % 200) as usize + 4);
                assert!(m[4..].iter().all(|&b| b == (i % 251) as u8));
                next += 1;
            }
            Ok(None) => thread::sleep(Duration::from_micros(20)),
            Err(StreamError::Closed { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    sender.join().unwrap();
    assert_eq!(next, 100_000);
}

#[test]
fn a_peer_that_is_not_sidecore_is_named_in_the_error() {
    let l = StreamListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        thread::sleep(Duration::from_millis(200));
    });
    let err = l
        .accept(Duration::from_secs(5))
        .err()
        .expect("bad hello must fail");
    let msg = err.to_string();
    assert!(msg.contains("127.0.0.1:"), "names the peer: {msg}");
    assert!(msg.contains("not a sidecore channel"), "{msg}");
    t.join().unwrap();
}

#[test]
fn wrong_channel_name_is_reported() {
    let l = StreamListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let _s = StreamSender::connect(addr, "other", Delivery::Reliable, Duration::from_secs(5))
            .unwrap();
        thread::sleep(Duration::from_millis(100));
    });
    let r = l.accept(Duration::from_secs(5)).unwrap();
    let e = r.expect_channel("records").unwrap_err().to_string();
    assert!(
        e.contains("expected channel `records`, peer opened `other`"),
        "{e}"
    );
    t.join().unwrap();
}

#[test]
fn unreliable_stream_never_blocks_and_counts_drops() {
    let l = StreamListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut s =
        StreamSender::connect(addr, "bulk", Delivery::Unreliable, Duration::from_secs(5)).unwrap();
    let r = l.accept(Duration::from_secs(5)).unwrap();
    // Nobody reads: the socket buffers and the local buffer fill, then drops start.
    let msg = vec![0u8; 60_000];
    let mut dropped = 0;
    for _ in 0..2_000 {
        if s.send(&msg).unwrap() == SendOutcome::Dropped {
            dropped += 1;
        }
        s.publish().unwrap();
    }
    assert!(dropped > 0);
    assert_eq!(s.counts().1, dropped);
    drop(r);
}

#[test]
fn a_connection_lost_without_the_end_mark_waits_out_its_grace_then_closes() {
    let l = StreamListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let grace = Duration::from_millis(300);
    // The sender's process "dies": its socket closes with no end mark.
    let mut s =
        StreamSender::connect(addr, "records", Delivery::Reliable, Duration::from_secs(5)).unwrap();
    s.send(b"one").unwrap();
    s.publish().unwrap();
    let raw = s.socket().unwrap();
    let mut r = l
        .accept(Duration::from_secs(5))
        .unwrap()
        .with_lost_grace(grace);
    std::mem::forget(s); // no Drop: no end mark
    raw.shutdown(std::net::Shutdown::Both).unwrap();
    drop(raw);
    assert_eq!(
        r.recv_timeout(Duration::from_secs(5)).unwrap().as_deref(),
        Some(&b"one"[..])
    );
    let t0 = std::time::Instant::now();
    // Lost, not closed: nothing to read while the grace lasts.
    assert!(r.try_recv().unwrap().is_none());
    assert!(r.is_lost());
    loop {
        match r.try_recv() {
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Ok(Some(m)) => panic!("read {m:?} from a lost connection"),
            Err(StreamError::Closed { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        t0.elapsed() >= grace - Duration::from_millis(20),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn a_sender_whose_peer_is_gone_is_full_for_its_grace_then_closed() {
    let waiting = lost_sender(Delivery::Reliable, SendOutcome::Full);
    assert_eq!(waiting.1, 0, "a reliable channel drops nothing");
}

#[test]
fn an_unreliable_sender_whose_peer_is_gone_drops_and_counts_for_its_grace() {
    let (n, dropped) = lost_sender(Delivery::Unreliable, SendOutcome::Dropped);
    assert!(dropped >= n, "{dropped} dropped, {n} while lost");
}

/// Sends to a peer whose socket was shut down until the channel reports
/// closed; every send while lost must come to `meanwhile`. Returns how many
/// did, and the sender's dropped count.
fn lost_sender(delivery: Delivery, meanwhile: SendOutcome) -> (u64, u64) {
    let l = StreamListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let grace = Duration::from_millis(300);
    let mut s = StreamSender::connect(addr, "records", delivery, Duration::from_secs(5))
        .unwrap()
        .with_lost_grace(grace);
    let r = l.accept(Duration::from_secs(5)).unwrap();
    // The receiver's socket shut down from another thread (as the origin does
    // when a part is lost): writes fail, and the sender finds it lost.
    r.socket()
        .unwrap()
        .shutdown(std::net::Shutdown::Both)
        .unwrap();
    drop(r);
    let t0 = std::time::Instant::now();
    let mut while_lost = 0;
    loop {
        // A message queued just before the loss is found is lost with it.
        let was_lost = s.is_lost();
        match s.send(&[7u8; 1000]).and_then(|o| s.publish().map(|()| o)) {
            Ok(o) if was_lost => {
                assert_eq!(o, meanwhile);
                while_lost += 1;
            }
            Ok(_) => {}
            Err(StreamError::Closed { .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never closed");
        thread::sleep(Duration::from_millis(1));
    }
    assert!(s.is_lost());
    assert!(while_lost > 0, "nothing sent while the grace lasted");
    (while_lost, s.counts().1)
}
