//! Namespace tokens (tls/src/token.rs): text any client sends in its
//! `authorization` metadata, read by every node before anything else of
//! the request. Whatever decodes re-signs to a token that decodes to the
//! same claims; nothing verifies under a key that did not sign it.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stele_tls::token::{self, Keyring, TokenError};

fn key() -> &'static (Vec<u8>, Keyring) {
    static KEY: OnceLock<(Vec<u8>, Keyring)> = OnceLock::new();
    KEY.get_or_init(|| {
        let (pkcs8, public) = token::generate_key().expect("a key");
        let ring = Keyring::default();
        ring.set(1, [(1, public)], []);
        (pkcs8, ring)
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (pkcs8, ring) = key();
    match token::decode(text) {
        Ok((claims, _, _)) => {
            // Only this target's key signs under id 1, and it never signed
            // the fuzzer's input.
            assert!(ring.verify(text, 0).is_err(), "an unsigned token verified");
            let signed = token::sign(pkcs8, &claims).expect("claims that decode re-sign");
            let (again, _, _) = token::decode(&signed).expect("a signed token decodes");
            assert_eq!(again, claims);
            if claims.key == 1 && claims.expires_at > 0 {
                assert_eq!(ring.verify(&signed, 0), Ok(claims));
            }
        }
        Err(TokenError::Malformed(_) | TokenError::TooLong) => {}
        Err(e) => panic!("decode gave {e:?}"),
    }
});
