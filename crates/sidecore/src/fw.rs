//! `sidecore fw`: the SCIRON console. `analyze` runs the policy advisor
//! (shadowed, redundant, generalized and correlated rule pairs); `check`
//! validates a rule file for every PE (it parses, compiles to the tuple-space
//! tables and fits the XDP classifier; no shadowed or redundant rule); `nft`
//! prints the host baseline's nftables ruleset; `load` reloads the rules of a
//! running firewall offcode live, through the daemon.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use sidecore_control::{Request, Response};
use sidecore_firewall::{Classifier, Finding, RuleSet, analyze, nft};

use crate::args::{CONTROL_TIMEOUT, SocketArgs};

#[derive(Debug, Subcommand)]
pub enum FwCommand {
    /// Report shadowed, redundant, generalized and correlated rules (TOML or the
    /// Al-Shaer & Hamed table layout), naming both rules and their lines.
    Analyze {
        rules: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Validate a rule file for every PE: exit 1 on an error or on a shadowed
    /// or redundant rule.
    Check {
        rules: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the nftables ruleset the host baseline installs.
    Nft {
        rules: PathBuf,
        /// The hook: `forward` (a middlebox) or `input` (a host).
        #[arg(long, default_value = "forward")]
        hook: String,
    },
    /// Check a rule file, then load it into a running firewall offcode live.
    Load {
        rules: PathBuf,
        /// The app (name or id) that runs the firewall.
        #[arg(long)]
        app: String,
        /// The firewall offcode's name in that app.
        #[arg(long, default_value = "firewall")]
        offcode: String,
        #[command(flatten)]
        socket: SocketArgs,
    },
}

pub fn run(cmd: FwCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        FwCommand::Analyze { rules, json } => {
            let rs = sidecore_firewall::load(&rules)?;
            let findings = analyze(&rs);
            if json {
                println!("{}", serde_json::to_string_pretty(&findings)?);
            } else {
                print_findings(&rs, &findings);
            }
            Ok(ExitCode::SUCCESS)
        }
        FwCommand::Check { rules, json } => check(&rules, json),
        FwCommand::Nft { rules, hook } => {
            let rs = sidecore_firewall::load(&rules)?;
            let hook = match hook.as_str() {
                "forward" => nft::Hook::Forward,
                "input" => nft::Hook::Input,
                other => anyhow::bail!("--hook: `{other}` is not `forward` or `input`"),
            };
            print!("{}", nft::render(&rs, hook));
            Ok(ExitCode::SUCCESS)
        }
        FwCommand::Load {
            rules,
            app,
            offcode,
            socket,
        } => load(&rules, &app, &offcode, &socket),
    }
}

fn print_findings(rs: &RuleSet, findings: &[Finding]) {
    for f in findings {
        let level = if f.anomaly.is_error() {
            "error"
        } else {
            "warning"
        };
        println!("{}:{}: {level}: {f}", rs.source, f.second.line);
    }
    println!(
        "{}: {} rules, {} findings ({} errors)",
        rs.source,
        rs.rules.len(),
        findings.len(),
        findings.iter().filter(|f| f.anomaly.is_error()).count()
    );
}

/// Everything that would make a PE refuse the rules, or the policy wrong.
fn check(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let rs = sidecore_firewall::load(path)?;
    let classifier = Classifier::compile(&rs)?;
    let findings = analyze(&rs);
    let errors = findings.iter().filter(|f| f.anomaly.is_error()).count();
    let shapes = classifier.shapes().len();
    let fits_xdp = shapes <= sidecore_kernel::firewall::MAX_SHAPES;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "rules": rs.rules.len(),
                "entries": classifier.len(),
                "shapes": shapes,
                "fits_xdp": fits_xdp,
                "findings": findings,
            }))?
        );
    } else {
        print_findings(&rs, &findings);
        println!(
            "{}: {} table entries in {shapes} tuple shapes (XDP probes at most {})",
            rs.source,
            classifier.len(),
            sidecore_kernel::firewall::MAX_SHAPES
        );
    }
    if !fits_xdp {
        eprintln!(
            "error: {}: {shapes} tuple shapes; the XDP classifier probes at most {} (use fewer distinct prefix lengths or port ranges)",
            rs.source,
            sidecore_kernel::firewall::MAX_SHAPES
        );
    }
    Ok(if errors == 0 && fits_xdp {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Checks the rules here (so a bad file is reported with its lines), then
/// asks the daemon to hand the path to the offcode, which reloads live.
fn load(path: &Path, app: &str, offcode: &str, socket: &SocketArgs) -> anyhow::Result<ExitCode> {
    let rs = sidecore_firewall::load(path)?;
    Classifier::compile(&rs)?;
    let abs = std::fs::canonicalize(path)?;
    let req = Request::Control {
        app: app.to_string(),
        offcode: offcode.to_string(),
        body: serde_json::json!({ "rules": abs.display().to_string() }),
    };
    let answer = match sidecore_control::request(&socket.path(), &req, CONTROL_TIMEOUT)? {
        Response::Ok { message, .. } => message.unwrap_or_default(),
        Response::Error { error } => anyhow::bail!(error),
    };
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap_or(serde_json::Value::Null);
    if let Some(e) = v.get("error") {
        anyhow::bail!("{app}/{offcode} refused {}: {e}", path.display());
    }
    println!(
        "{app}/{offcode}: loaded {} rules from {}",
        v.get("reloaded")
            .map_or_else(|| answer.clone(), ToString::to_string),
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}
