//! The Registry service's codec: prost, with buffers sized for heartbeats.
//!
//! tonic allocates a call's encode and decode buffers when the call starts,
//! 8 KiB each by default. A `Heartbeats` stream stays open for the life of
//! a plugin instance, so kplug would hold 16 KiB of buffers per instance
//! for messages of a few hundred bytes (BENCHMARKS.md, "Heartbeats on a
//! stream", has what 10,000 open streams cost with each size). A message
//! larger than the buffer still fits: tonic grows the buffer in steps of
//! its size (a heartbeat with a certificate request, an answer with a
//! trust bundle).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The buffers' initial size, and the step they grow by.
pub const HEARTBEAT_BUFFER_BYTES: usize = 1024;
/// tonic's default: how much encoded output a stream buffers before it
/// yields to the connection.
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// [`tonic_prost::ProstCodec`] with [`HEARTBEAT_BUFFER_BYTES`] buffers.
#[derive(Debug, Clone, Copy)]
pub struct HeartbeatCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for HeartbeatCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(HEARTBEAT_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

impl<T, U> Codec for HeartbeatCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(buffer_settings())
    }
}
