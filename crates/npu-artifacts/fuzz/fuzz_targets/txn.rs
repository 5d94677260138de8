//! Fuzzes the TXN parser and listing: they must never panic, never loop, and agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use npu_artifacts::txn::{self, TxnProgram};

fuzz_target!(|data: &[u8]| {
    match TxnProgram::parse(data) {
        Ok(program) => {
            assert_eq!(program.size_bytes as usize, data.len());
            assert!(program.arg_count() <= txn::MAX_ARGS as usize);
            let sizes = program.min_arg_sizes();
            assert!(program.check_buffers(&sizes).is_ok());
            let text = txn::listing(data).expect("a stream that parses is listed");
            assert!(text.lines().count() > program.op_count as usize);
        }
        Err(e) => {
            assert!(txn::listing(data).is_err());
            let text = txn::explain(data);
            assert!(text.ends_with(&format!("error: {e}\n")));
        }
    }
});
