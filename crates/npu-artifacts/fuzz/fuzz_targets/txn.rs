//! Fuzzes the TXN parser and listing: they must never panic, never loop, and agree; an accepted
//! stream never patches a BD without a length. Parsing holds at most 8 bytes per input byte at
//! its peak, the listing and explanation twice the 12 bytes of text per input byte they document
//! (the cost oracle).
#![no_main]

#[path = "common/cost.rs"]
mod cost;

use libfuzzer_sys::fuzz_target;
use npu_artifacts::txn::{self, TxnProgram};

fuzz_target!(|data: &[u8]| {
    match cost::check("TxnProgram::parse", data.len(), 8, || {
        TxnProgram::parse(data)
    }) {
        Ok(program) => {
            assert_eq!(program.size_bytes as usize, data.len());
            assert!(program.arg_count() <= txn::MAX_ARGS as usize);
            // Every patch follows a non-zero length for its BD, or parse would have refused it.
            assert!(
                program
                    .args
                    .iter()
                    .flat_map(|a| &a.patches)
                    .all(|p| p.bd_len_bytes > 0 && p.min_size() > p.offset)
            );
            let sizes = program.min_arg_sizes();
            assert!(program.check_buffers(&sizes).is_ok());
            let text = cost::check("listing", data.len(), 24, || txn::listing(data))
                .expect("a stream that parses is listed");
            assert!(text.lines().count() > program.op_count as usize);
        }
        Err(e) => {
            assert!(txn::listing(data).is_err());
            let text = cost::check("explain", data.len(), 24, || txn::explain(data));
            assert!(text.ends_with(&format!("error: {e}\n")));
        }
    }
});
