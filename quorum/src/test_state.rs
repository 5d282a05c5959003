//! A small state for this crate's tests: a running sum of the numbers its
//! commands carry.

use serde::{Deserialize, Serialize};

use crate::CborState;

pub(crate) const TALLY_V: u16 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tally {
    pub v: u16,
    pub sum: u64,
    pub count: u64,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            v: TALLY_V,
            ..Default::default()
        }
    }
}

impl CborState for Tally {
    type Command = u64;
    /// The sum after the command, or why it was refused.
    type Reply = Result<u64, String>;
    const VERSION: u16 = TALLY_V;

    fn version(&self) -> u16 {
        self.v
    }

    fn apply_command(&mut self, n: u64) -> Self::Reply {
        self.sum += n;
        self.count += 1;
        Ok(self.sum)
    }

    fn refused(reason: String) -> Self::Reply {
        Err(reason)
    }

    fn name() -> &'static str {
        "tally"
    }
}
