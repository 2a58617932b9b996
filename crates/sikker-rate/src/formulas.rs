//! The equations of chapter 5, exactly as printed, one function each.

/// Eq. 5.1: the minimum number of relays, `N_r = ceiling(R_a / R_r)`.
pub fn relay_count(r_a: f64, r_r: f64) -> usize {
    (r_a / r_r).ceil() as usize
}

/// Eq. 5.2: the fixed rate of each relay, `R_t = R_a / N_r`.
pub fn relay_rate(r_a: f64, n_r: usize) -> f64 {
    r_a / n_r as f64
}

/// Eq. 5.3: tokens asked of each peer, `T_ask = ((S_b − N_t) / N_peers) × F_t`.
pub fn t_ask(s_b: f64, n_t: f64, n_peers: usize, f_t: f64) -> f64 {
    ((s_b - n_t) / n_peers as f64) * f_t
}

/// Eq. 5.4: tokens given to a requesting peer, `T_give = min(T_ask, max(0, N_t − Th_t))`.
pub fn t_give(t_ask: f64, n_t: f64, th_t: f64) -> f64 {
    t_ask.min((n_t - th_t).max(0.0))
}

/// Eq. 5.5: rate asked of each peer, `R_ask = ((1.0 − R_t) / N_peers) × F_r`, with
/// rates normalised so that 1.0 is the line rate.
///
/// **[A]** clamped at zero when `R_t > 1.0` (the digest's reconstructed pseudo-code:
/// a negative ask has no meaning).
pub fn r_ask(r_t: f64, n_peers: usize, f_r: f64) -> f64 {
    ((1.0 - r_t) / n_peers as f64).max(0.0) * f_r
}

/// Eq. 5.6: rate given to a requesting peer, `R_give = min(R_ask, R_t × F_mr)`
/// (the giver then sets `R_t = R_t − R_give`). Whether to give at all is decided by
/// the token threshold `Th_r` (§5.5), see [`crate::SeSender::on_request`].
pub fn r_give(r_ask: f64, r_t: f64, f_mr: f64) -> f64 {
    r_ask.min(r_t * f_mr)
}

/// Eq. 8.1: the maximum aggregate burst `T_bs = S_b × N_tb`, in tokens.
pub fn max_aggregate_burst(s_b: f64, n_tb: usize) -> f64 {
    s_b * n_tb as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    // The worked examples of chapter 5.
    #[test]
    fn relay_example_of_section_5_2() {
        // 80 Gbps over 25 Gbps relays: 4 relays at 20 Gbps.
        assert_eq!(relay_count(80.0, 25.0), 4);
        assert_eq!(relay_rate(80.0, 4), 20.0);
        // RateSim: 500 phits/cycle over line-rate relays.
        assert_eq!(relay_count(500.0, 1.0), 500);
    }

    #[test]
    fn token_ask_example_of_section_5_4() {
        assert_eq!(t_ask(500.0, 200.0, 3, 1.0), 100.0);
    }

    #[test]
    fn token_give_takes_only_above_threshold() {
        assert_eq!(t_give(100.0, 1500.0, 700.0), 100.0);
        assert_eq!(t_give(1000.0, 1500.0, 700.0), 800.0);
        assert_eq!(t_give(100.0, 500.0, 700.0), 0.0);
    }

    #[test]
    fn rate_ask_example_of_section_5_5() {
        assert!((r_ask(0.4, 3, 1.0) - 0.2).abs() < 1e-12);
        assert_eq!(r_ask(1.2, 3, 1.0), 0.0);
    }

    #[test]
    fn rate_give_is_capped_by_factor() {
        assert_eq!(r_give(0.2, 0.5, 0.25), 0.125);
        assert_eq!(r_give(0.1, 0.5, 0.25), 0.1);
    }

    #[test]
    fn burst_of_table_8_2() {
        // 2000 phits × 1000 buckets × 100 bits / 8 = 25 MB.
        let bytes = max_aggregate_burst(2000.0, 1000) * 100.0 / 8.0;
        assert_eq!(bytes, 25e6);
    }
}
