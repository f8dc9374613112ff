//! T-SQL text as tokens, with the parenthesis depth of each: enough structure for the
//! legality rules (which table a hint list belongs to, which query an `ORDER BY` ends)
//! without a full grammar.

/// What a token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A keyword or a regular identifier, upper-cased (`SELECT`, `X`, `SYSUTCDATETIME`).
    Word,
    /// A bracket-quoted identifier, unquoted (`[a]]b]` is `a]b`).
    Quoted,
    /// A string literal, unquoted (`N'it''s'` is `it's`).
    Str,
    /// A variable or parameter (`@P1`, `@@TRANCOUNT`).
    Var,
    /// A number.
    Num,
    /// Punctuation or an operator (`(`, `,`, `<=`).
    Punct,
}

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) kind: Kind,
    /// The text: upper-cased for words, unquoted for identifiers and strings.
    pub(crate) text: String,
    /// Open parentheses before it (a `(` has the depth outside it, its `)` the same).
    pub(crate) depth: usize,
}

impl Token {
    /// Whether this is the keyword `word` (upper case).
    pub(crate) fn is(&self, word: &str) -> bool {
        self.kind == Kind::Word && self.text == word
    }
    /// Whether this is the punctuation `p`.
    pub(crate) fn is_punct(&self, p: &str) -> bool {
        self.kind == Kind::Punct && self.text == p
    }
    /// Whether this names an object part (a regular or quoted identifier).
    pub(crate) fn is_name(&self) -> bool {
        matches!(self.kind, Kind::Word | Kind::Quoted)
    }
}

/// Why a text could not be read as tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LexError(pub(crate) String);

/// `sql` as tokens, comments dropped.
pub(crate) fn tokens(sql: &str) -> Result<Vec<Token>, LexError> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let push = |out: &mut Vec<Token>, kind, text: String, depth| {
        out.push(Token { kind, text, depth });
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let end = find_from(&chars, i + 2, &['*', '/'])
                .ok_or_else(|| LexError("an unterminated /* comment".into()))?;
            i = end + 2;
        } else if c == '[' {
            let (text, end) = quoted(&chars, i + 1, ']')
                .ok_or_else(|| LexError("an unterminated [identifier".into()))?;
            push(&mut out, Kind::Quoted, text, depth);
            i = end;
        } else if c == '\'' || ((c == 'N' || c == 'n') && next == Some('\'')) {
            let start = if c == '\'' { i + 1 } else { i + 2 };
            let (text, end) = quoted(&chars, start, '\'')
                .ok_or_else(|| LexError("an unterminated string".into()))?;
            push(&mut out, Kind::Str, text, depth);
            i = end;
        } else if c.is_alphabetic() || c == '_' || c == '#' {
            let end = scan(&chars, i, |c| c.is_alphanumeric() || "_#$".contains(c));
            let text: String = chars[i..end].iter().collect();
            push(&mut out, Kind::Word, text.to_uppercase(), depth);
            i = end;
        } else if c == '@' {
            let end = scan(&chars, i, |c| c.is_alphanumeric() || "_@#$".contains(c));
            let text: String = chars[i..end].iter().collect();
            push(&mut out, Kind::Var, text.to_uppercase(), depth);
            i = end;
        } else if c.is_ascii_digit() {
            let end = scan(&chars, i, |c| c.is_ascii_alphanumeric() || c == '.');
            push(&mut out, Kind::Num, chars[i..end].iter().collect(), depth);
            i = end;
        } else if c == '(' {
            push(&mut out, Kind::Punct, "(".into(), depth);
            depth += 1;
            i += 1;
        } else if c == ')' {
            depth = depth
                .checked_sub(1)
                .ok_or_else(|| LexError("a ) without its (".into()))?;
            push(&mut out, Kind::Punct, ")".into(), depth);
            i += 1;
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = if ["<=", ">=", "<>", "!=", "!<", "!>"].contains(&two.as_str()) {
                two
            } else {
                c.to_string()
            };
            i += op.chars().count();
            push(&mut out, Kind::Punct, op, depth);
        }
    }
    if depth != 0 {
        return Err(LexError(format!("{depth} ( left open")));
    }
    Ok(out)
}

fn scan(chars: &[char], from: usize, keep: impl Fn(char) -> bool) -> usize {
    let mut end = from + 1;
    while end < chars.len() && keep(chars[end]) {
        end += 1;
    }
    end
}

fn find_from(chars: &[char], from: usize, pair: &[char; 2]) -> Option<usize> {
    (from..chars.len().saturating_sub(1)).find(|&j| chars[j] == pair[0] && chars[j + 1] == pair[1])
}

/// The text up to the closing `close` (doubled, it stands for itself), and the index
/// after it.
fn quoted(chars: &[char], from: usize, close: char) -> Option<(String, usize)> {
    let mut text = String::new();
    let mut j = from;
    while j < chars.len() {
        if chars[j] == close {
            if chars.get(j + 1) == Some(&close) {
                text.push(close);
                j += 2;
                continue;
            }
            return Some((text, j + 1));
        }
        text.push(chars[j]);
        j += 1;
    }
    None
}

/// The index of the `)` closing the `(` at `open`.
pub(crate) fn closing(tokens: &[Token], open: usize) -> usize {
    let depth = tokens[open].depth;
    (open + 1..tokens.len())
        .find(|&j| tokens[j].is_punct(")") && tokens[j].depth == depth)
        .unwrap_or(tokens.len())
}

/// `tokens` split into statements at the `;`s outside parentheses (empty ones
/// dropped).
pub(crate) fn statements(tokens: &[Token]) -> Vec<&[Token]> {
    tokens
        .split(|t| t.is_punct(";") && t.depth == 0)
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_strings_comments_and_depth() {
        let toks =
            tokens("SELECT [a]]b], N'it''s', @P1 -- gone\n /* gone */ FROM (x) WHERE y <= 2;")
                .unwrap();
        let texts: Vec<&str> = toks.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "SELECT", "a]b", ",", "it's", ",", "@P1", "FROM", "(", "X", ")", "WHERE", "Y",
                "<=", "2", ";"
            ]
        );
        assert_eq!(toks[1].kind, Kind::Quoted);
        assert_eq!(toks[3].kind, Kind::Str);
        assert_eq!(toks[8].depth, 1);
        assert_eq!(toks[9].depth, 0);
        assert_eq!(closing(&toks, 7), 9);
        assert_eq!(statements(&toks).len(), 1);
    }

    #[test]
    fn unbalanced_text_is_an_error() {
        assert!(tokens("SELECT (1").is_err());
        assert!(tokens("SELECT 1)").is_err());
        assert!(tokens("SELECT 'x").is_err());
        assert!(tokens("SELECT [x").is_err());
        assert!(tokens("SELECT 1 /* x").is_err());
    }
}
