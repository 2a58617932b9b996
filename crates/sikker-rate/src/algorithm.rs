//! The six algorithms of chapter 5 by name.

use crate::se::SeVariant;

/// The six rate-control algorithms of chapter 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Algorithm {
    /// Nothing Enforced (§5.1).
    Ne,
    /// Relay Enforced (§5.2).
    Re,
    /// Sender-Enforced, Fixed Allocation (§5.3).
    SeFa,
    /// Sender-Enforced, Token Exchange (§5.4).
    SeTe,
    /// Sender-Enforced, Rate Exchange (§5.5).
    SeRe,
    /// Sender-Enforced, Token and Rate Exchange (§5.6).
    SeTre,
}

impl Algorithm {
    /// All six, in the order of Table 8.1.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Ne,
        Algorithm::Re,
        Algorithm::SeFa,
        Algorithm::SeTe,
        Algorithm::SeRe,
        Algorithm::SeTre,
    ];

    /// The name used in the dissertation.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ne => "NE",
            Algorithm::Re => "RE",
            Algorithm::SeFa => "SE-FA",
            Algorithm::SeTe => "SE-TE",
            Algorithm::SeRe => "SE-RE",
            Algorithm::SeTre => "SE-TRE",
        }
    }

    /// The section of chapter 5 that defines it.
    pub fn section(self) -> &'static str {
        match self {
            Algorithm::Ne => "5.1",
            Algorithm::Re => "5.2",
            Algorithm::SeFa => "5.3",
            Algorithm::SeTe => "5.4",
            Algorithm::SeRe => "5.5",
            Algorithm::SeTre => "5.6",
        }
    }

    /// Whether the algorithm guarantees the aggregate limit (Table 8.1 "Correct").
    pub fn correct(self) -> bool {
        !matches!(self, Algorithm::Ne)
    }

    /// The sender-enforced variant, for the four SE algorithms.
    pub fn se_variant(self) -> Option<SeVariant> {
        match self {
            Algorithm::SeFa => Some(SeVariant::FixedAllocation),
            Algorithm::SeTe => Some(SeVariant::TokenExchange),
            Algorithm::SeRe => Some(SeVariant::RateExchange),
            Algorithm::SeTre => Some(SeVariant::TokenAndRateExchange),
            _ => None,
        }
    }

    /// Parses a dissertation name (`se-tre`, `SE-TRE`, `setre` ...).
    pub fn parse(s: &str) -> Option<Algorithm> {
        let k: String = s
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            .to_ascii_lowercase();
        Some(match k.as_str() {
            "ne" => Algorithm::Ne,
            "re" => Algorithm::Re,
            "sefa" => Algorithm::SeFa,
            "sete" => Algorithm::SeTe,
            "sere" => Algorithm::SeRe,
            "setre" => Algorithm::SeTre,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Some(a));
        }
        assert_eq!(Algorithm::parse("se_tre"), Some(Algorithm::SeTre));
        assert_eq!(Algorithm::parse("bogus"), None);
    }
}
