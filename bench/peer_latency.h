// One-way peer-to-peer store latency between two GPUs of one process: a
// flag ping-pong over NVLink, half the round trip.
#pragma once

namespace spark_decode::bench {

// Microseconds, median over `trials` runs of `round_trips` exchanges between
// device a and device b (peer access is enabled if it is not yet).
double peer_store_latency_us(int device_a, int device_b, int round_trips = 2000, int trials = 5);

}  // namespace spark_decode::bench
