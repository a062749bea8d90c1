//! A binary's settings parsed from given flags and environment variables
//! rather than the process's own: what a manifest gives a container can be
//! checked with the very parser the binary runs, without touching the
//! test process's environment.

use std::collections::BTreeMap;

use clap::{Args, Command, FromArgMatches};

/// Parses `args` (flags, as a container's `args` lists them) and `env` (the
/// container's variables, already expanded) into `T` as the binary's clap
/// parser would. A flag given in `args` wins over its variable, as it does
/// for the binary. Variables no flag reads are ignored here (checking the
/// names is the caller's business).
pub fn parse<T: Args + FromArgMatches>(
    binary: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<T, String> {
    let command = T::augment_args(Command::new(binary.to_owned()));
    let mut argv = vec![binary.to_owned()];
    for arg in command.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let Some(value) = var.to_str().and_then(|var| env.get(var)) else {
            continue;
        };
        let flag = format!("--{long}");
        let given = args
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
        if given {
            continue;
        }
        if arg.get_action().takes_values() {
            argv.push(format!("{flag}={value}"));
        } else if !is_falsey(value) {
            // A switch read from the environment: clap counts any value but
            // a false one as set.
            argv.push(flag);
        }
    }
    argv.extend(args.iter().cloned());
    let matches = command
        .mut_args(|arg| arg.env(None))
        .try_get_matches_from(argv)
        .map_err(|e| e.render().to_string())?;
    T::from_arg_matches(&matches).map_err(|e| e.render().to_string())
}

/// The values clap reads as "off" for a switch set by its variable.
fn is_falsey(value: &str) -> bool {
    ["", "n", "no", "f", "false", "off", "0"].contains(&value.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Args)]
    struct Example {
        #[arg(long, env = "EXAMPLE_COUNT", default_value_t = 1)]
        count: u32,
        #[arg(long, env = "EXAMPLE_LOUD")]
        loud: bool,
        #[arg(long, env = "EXAMPLE_NAMES", value_delimiter = ',')]
        names: Vec<String>,
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn variables_and_flags_parse_as_the_binary_would() {
        let parsed: Example = parse(
            "example",
            &["--count=3".into()],
            &env(&[
                ("EXAMPLE_COUNT", "2"),
                ("EXAMPLE_LOUD", "true"),
                ("EXAMPLE_NAMES", "a,b"),
            ]),
        )
        .unwrap();
        assert_eq!(parsed.count, 3, "the flag wins over the variable");
        assert!(parsed.loud);
        assert_eq!(parsed.names, ["a", "b"]);
        let quiet: Example = parse("example", &[], &env(&[("EXAMPLE_LOUD", "false")])).unwrap();
        assert!(!quiet.loud);
        assert_eq!(quiet.count, 1);
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_flag() {
        let refused =
            parse::<Example>("example", &[], &env(&[("EXAMPLE_COUNT", "many")])).unwrap_err();
        assert!(refused.contains("--count"), "{refused}");
    }
}
