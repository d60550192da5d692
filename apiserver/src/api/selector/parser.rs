//! The label selector's recursive-descent parser, from tokens to requirements.

use std::collections::BTreeSet;

use super::SelectorError;
use super::label::{Op, Requirement};
use super::lexer::{Token, tokenize};
use kplug_api::validation::{label_key, label_value};

/// Recursive descent over apimachinery's grammar; each error message matches
/// the one its parser gives at the same point.
pub(super) struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn new(s: &'a str) -> Self {
        Self {
            tokens: tokenize(s),
            pos: 0,
        }
    }

    fn peek(&self) -> Token<'a> {
        self.tokens.get(self.pos).copied().unwrap_or(Token::End)
    }

    fn next(&mut self) -> Token<'a> {
        let token = self.peek();
        self.pos += 1;
        token
    }

    pub(super) fn selector(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        match self.peek() {
            Token::End => return Ok(requirements),
            Token::Ident(_) | Token::Bang => {}
            other => {
                return Err(SelectorError::LabelSyntax(format!(
                    "found '{}', expected: !, identifier, or 'end of string'",
                    other.literal()
                )));
            }
        }
        loop {
            let requirement = self
                .requirement()
                .map_err(SelectorError::LabelRequirement)?;
            requirements.push(requirement);
            match self.next() {
                Token::End => return Ok(requirements),
                Token::Comma => match self.peek() {
                    Token::Ident(_) | Token::Bang => {}
                    other => {
                        return Err(SelectorError::LabelSyntax(format!(
                            "found '{}', expected: identifier after ','",
                            other.literal()
                        )));
                    }
                },
                other => {
                    return Err(SelectorError::LabelSyntax(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.literal()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let negated = self.peek() == Token::Bang;
        if negated {
            self.next();
        }
        let key = match self.next() {
            Token::Ident(key) => key,
            other => {
                return Err(format!("found '{}', expected: identifier", other.literal()));
            }
        };
        if let Some(problem) = label_key(key) {
            return Err(format!("key: Invalid value: {key:?}: {problem}"));
        }
        let requirement = |op| Requirement {
            key: key.to_owned(),
            op,
        };
        // Whatever follows `!key` is left for the caller to reject.
        if negated {
            return Ok(requirement(Op::DoesNotExist));
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(requirement(Op::Exists));
        }
        let op = match self.next() {
            Token::Ident("in") => Op::In(self.value_set(key)?),
            Token::Ident("notin") => Op::NotIn(self.value_set(key)?),
            Token::Equals | Token::DoubleEquals => Op::In(self.exact_value(key)?),
            Token::NotEquals => Op::NotIn(self.exact_value(key)?),
            Token::Greater => Op::Gt(self.integer_value(key)?),
            Token::Less => Op::Lt(self.integer_value(key)?),
            other => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                ));
            }
        };
        Ok(requirement(op))
    }

    fn value_set(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Token::Open => {}
            // apimachinery's wording, missing comma included.
            other => return Err(format!("found '{}' expected: '('", other.literal())),
        }
        match self.peek() {
            Token::Close => {
                return Err(
                    "values: Invalid value: []: for 'in', 'notin' operators, values \
                            set can't be empty"
                        .to_owned(),
                );
            }
            Token::Ident(_) | Token::Comma => {}
            other => {
                return Err(format!(
                    "found '{}', expected: ',', ')' or identifier",
                    other.literal()
                ));
            }
        }
        let mut values = BTreeSet::new();
        loop {
            // An element is one identifier or nothing (the empty value).
            let element = match self.peek() {
                Token::Ident(value) => {
                    self.next();
                    Some(value)
                }
                _ => None,
            };
            values.insert(element.unwrap_or_default().to_owned());
            match self.next() {
                Token::Comma => {}
                Token::Close => break,
                other if element.is_some() => {
                    return Err(format!("found '{}', expected: ',' or ')'", other.literal()));
                }
                other => {
                    return Err(format!(
                        "found '{}', expected: ',', or identifier",
                        other.literal()
                    ));
                }
            }
        }
        validate_values(key, &values)?;
        Ok(values)
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; nothing means the empty value.
    fn raw_exact_value(&mut self) -> Result<&'a str, String> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok("");
        }
        match self.next() {
            Token::Ident(value) => Ok(value),
            other => Err(format!("found '{}', expected: identifier", other.literal())),
        }
    }

    fn exact_value(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        let values = BTreeSet::from([self.raw_exact_value()?.to_owned()]);
        validate_values(key, &values)?;
        Ok(values)
    }

    fn integer_value(&mut self, key: &str) -> Result<i64, String> {
        let raw = self.raw_exact_value()?;
        // Same syntax as Go's strconv.ParseInt(raw, 10, 64): optional sign, digits.
        let Ok(value) = raw.parse::<i64>() else {
            return Err(format!(
                "values[0]: Invalid value: {raw:?}: for 'Gt', 'Lt' operators, the value must \
                 be an integer"
            ));
        };
        // A sign is not a valid label value, so apimachinery rejects `k>-1`.
        validate_values(key, &BTreeSet::from([raw.to_owned()]))?;
        Ok(value)
    }
}

fn validate_values(key: &str, values: &BTreeSet<String>) -> Result<(), String> {
    for (index, value) in values.iter().enumerate() {
        if let Some(problem) = label_value(value) {
            return Err(format!(
                "values[{index}][{key}]: Invalid value: {value:?}: {problem}"
            ));
        }
    }
    Ok(())
}
