//! `Mapping` against real memfds.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use npu_fd::{FdError, Mapping, memfd};

fn page() -> usize {
    rustix::param::page_size()
}

/// A memfd name that no other test in this process uses.
fn unique_name(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "npu-fd-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Byte `i` of the test pattern.
fn pattern(i: usize) -> u8 {
    u8::try_from(i % 251).expect("below 251")
}

fn maps_mention(name: &str) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let needle = format!("/memfd:{name} ");
    maps.lines()
        .any(|line| line.contains(&needle) || line.ends_with(&format!("/memfd:{name}")))
}

#[test]
fn two_mappings_see_each_others_writes() {
    let size = 2 * page();
    let fd = memfd::create("npu-fd-share", size as u64).expect("memfd");
    let mut whole = Mapping::new(fd.as_fd(), 0, size).expect("map whole");
    let mut tail = Mapping::new(fd.as_fd(), page() as u64, page()).expect("map tail");

    whole.copy_from_slice(page(), b"abcd").expect("write whole");
    assert_eq!(tail.read_vec::<u8>(0, 4).expect("read tail"), b"abcd");

    tail.copy_from_slice(page() - 3, b"xyz")
        .expect("write tail");
    assert_eq!(
        whole.read_vec::<u8>(size - 3, 3).expect("read whole"),
        b"xyz"
    );
}

#[test]
fn unaligned_offset_maps_from_the_page_below() {
    let size = 3 * page();
    let fd = memfd::create("npu-fd-offset", size as u64).expect("memfd");
    let mut whole = Mapping::new(fd.as_fd(), 0, size).expect("map whole");
    let bytes: Vec<u8> = (0..size).map(pattern).collect();
    whole.copy_from_slice(0, &bytes).expect("write");
    let offset = page() + 1;
    let part = Mapping::new(fd.as_fd(), offset as u64, 1000).expect("map at page + 1");
    assert_eq!(part.len(), 1000);
    assert_eq!(part.offset(), offset as u64);
    assert_eq!(part.as_ptr() as usize % page(), 1);
    assert_eq!(
        part.read_vec::<u8>(0, 1000).expect("part"),
        whole.read_vec::<u8>(offset, 1000).expect("whole")
    );

    // The last byte of the fd, from an offset in the middle of a page.
    let last = Mapping::new_read_only(fd.as_fd(), (size - 1) as u64, 1).expect("map last byte");
    assert_eq!(
        last.read_vec::<u8>(0, 1).expect("last"),
        [pattern(size - 1)]
    );
}

#[test]
fn typed_views_check_alignment_and_length() {
    let fd = memfd::create("npu-fd-typed", page() as u64).expect("memfd");
    let mut map = Mapping::new(fd.as_fd(), 0, 64).expect("map");
    // SAFETY: the memfd is this test's own and nothing writes it while a view lives; each
    // view, this one and those below, is dropped before the next write.
    let words = unsafe { map.as_mut_slice_of::<u32>() };
    words.expect("aligned")[1] = 0x0403_0201;
    assert_eq!(map.read_vec::<u8>(4, 4).expect("bytes"), [1, 2, 3, 4]);
    // SAFETY: as above.
    let wide = unsafe { map.as_slice_of::<u64>() };
    assert_eq!(wide.expect("aligned").len(), 8);

    let odd = Mapping::new(fd.as_fd(), 2, 8).expect("map at 2");
    // SAFETY: as above.
    let err = unsafe { odd.as_slice_of::<u32>() }.expect_err("misaligned");
    let text = err.to_string();
    assert!(
        text.starts_with("cannot view 8 mapped bytes as [u32]: the first byte is at 0x"),
        "{text}"
    );
    assert!(
        text.ends_with("which is not a multiple of the 4-byte alignment; map from an offset that is a multiple of 4"),
        "{text}"
    );
    // SAFETY: as above.
    let halves = unsafe { odd.as_slice_of::<u16>() };
    assert_eq!(halves.expect("2-aligned").len(), 4);

    let mut short = Mapping::new(fd.as_fd(), 0, 10).expect("map 10");
    // SAFETY: as above.
    let err = unsafe { short.as_mut_slice_of::<u32>() }.expect_err("slop");
    assert_eq!(
        err.to_string(),
        "cannot view 10 mapped bytes as [u32]: 10 is not a multiple of the 4-byte element size"
    );
    assert!(matches!(err, FdError::BadView { .. }));
}

#[test]
fn drop_unmaps() {
    let name = unique_name("drop");
    let fd = memfd::create(&name, page() as u64).expect("memfd");
    let map = Mapping::new(fd.as_fd(), 0, page()).expect("map");
    assert!(maps_mention(&name), "mapped memfd shows in /proc/self/maps");
    drop(map);
    assert!(
        !maps_mention(&name),
        "dropped mapping is gone from /proc/self/maps"
    );
}

#[test]
fn mapping_outlives_the_fd_and_moves_between_threads() {
    let name = unique_name("outlive");
    let fd = memfd::create(&name, page() as u64).expect("memfd");
    let mut map = Mapping::new(fd.as_fd(), 0, page()).expect("map");
    drop(fd);
    map.copy_from_slice(0, &[42]).expect("write");
    let handle = std::thread::spawn(move || {
        assert_eq!(map.read_vec::<u8>(0, 1).expect("read"), [42]);
        drop(map);
    });
    handle.join().expect("thread");
    assert!(!maps_mention(&name));
}

#[test]
fn read_only_fd_cannot_be_mapped_read_write() {
    let fd = memfd::create("npu-fd-ro", page() as u64).expect("memfd");
    let read_only = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("reopen");
    let err = Mapping::new(read_only.as_fd(), 0, page()).expect_err("EACCES");
    assert!(err.to_string().starts_with("mmap failed: "), "{err}");
    let map = Mapping::new_read_only(read_only.as_fd(), 0, page()).expect("read-only map");
    assert_eq!(map.read_vec::<u8>(0, 1).expect("read"), [0]);
}
