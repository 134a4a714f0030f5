// The Jinja subset on small templates. Every expected string in the first part is what
// Python jinja2 3.1 renders for the same template and variables with the settings of
// transformers' apply_chat_template (trim_blocks, lstrip_blocks, loopcontrols).

#include <gtest/gtest.h>

#include <iterator>
#include <nlohmann/json.hpp>

#include "engine/chat_template.h"
#include "engine/jinja_eval.h"
#include "engine/jinja_parser.h"

namespace pagellm::engine::jinja {
namespace {

// Renders `source` with the members of the JSON object `context` as variables.
std::string render(const std::string& source, const std::string& context) {
  const Body body = parse_template(source);
  std::vector<std::pair<std::string, Value>> variables;
  const auto json = nlohmann::ordered_json::parse(context);
  for (auto it = json.begin(); it != json.end(); ++it) {
    variables.emplace_back(it.key(), from_json(it.value()));
  }
  return jinja::render(body, std::move(variables));
}

// The ChatTemplateError message of parsing and rendering `source`, or "" if none.
std::string error_of(const std::string& source, const std::string& context = "{}") {
  try {
    render(source, context);
  } catch (const ChatTemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaWhitespace, TrimBlocksEatsOneNewline) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nafter\n\n", "{}"), "yes\nafter\n");
}

TEST(JinjaWhitespace, LstripBlocksStripsIndentBeforeTags) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\nend", "{}"), "  x\nend");
}

TEST(JinjaWhitespace, LstripBlocksKeepsIndentBeforeVariables) {
  EXPECT_EQ(render("  {{ 'a' }}\n  {% set y = 1 %}b", "{}"), "  a\nb");
}

TEST(JinjaWhitespace, LstripOnlyWhenTagStartsTheLine) {
  EXPECT_EQ(render("text {% if true %}x{% endif %}\n\t {% if true %}y{% endif %}", "{}"),
            "text xy");
}

TEST(JinjaWhitespace, MinusStripsAllWhitespaceAround) {
  EXPECT_EQ(render("a  \n {%- if true -%}  \n b {%- endif %}\n c", "{}"), "ab c");
}

TEST(JinjaWhitespace, MinusOnVariableTags) {
  EXPECT_EQ(render("a \n {{- 'x' -}} \n b {{ 'y' -}}\n\n z", "{}"), "axb yz");
}

TEST(JinjaWhitespace, PlusDisablesLstrip) {
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}", "{}"), "  x");
}

TEST(JinjaWhitespace, PlusDisablesTrim) {
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}", "{}"), "\nx");
}

TEST(JinjaWhitespace, CommentsFollowBlockRules) {
  EXPECT_EQ(render("a\n  {# note #}\nb {#- c -#}  x{# multi\nline #}\ny", "{}"), "a\nbxy");
}

TEST(JinjaWhitespace, OneTrailingNewlineDropped) {
  EXPECT_EQ(render("x\n\n", "{}"), "x\n");
}

TEST(JinjaWhitespace, CrLfBecomesLf) {
  EXPECT_EQ(render("a\r\nb{% if true %}\r\nc{% endif %}\rd", "{}"), "a\nbcd");
}

TEST(JinjaWhitespace, RawBlock) {
  EXPECT_EQ(render("{% raw %}{{ x }}{% if %}{% endraw %}!", "{}"), "{{ x }}{% if %}!");
}

TEST(JinjaWhitespace, LoneBracesAreText) {
  EXPECT_EQ(render("a { b } {x} %} }}", "{}"), "a { b } {x} %} }}");
}

TEST(JinjaWhitespace, TagWithBracesInsideStrings) {
  EXPECT_EQ(render("{{ '}}' ~ \"%}\" }}|{{ {'a': {'b': 1}} }}", "{}"), "}}%}|{'a': {'b': 1}}");
}

TEST(JinjaWhitespace, UnicodeWhitespaceStrippedByMinus) {
  EXPECT_EQ(render("a\u3000 {{- 'b' }}", "{}"), "ab");
}

TEST(JinjaLoops, LoopVariables) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
                   "loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
                   "{\"xs\": [\"a\", \"b\", \"c\"]}"),
            "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|");
}

TEST(JinjaLoops, LoopPrevNextAndCycle) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.previtem is defined }}{{ loop.nextitem }}{{ "
                   "loop.cycle('o', 'e') }};{% endfor %}",
                   "{\"xs\": [1, 2, 3]}"),
            "False2o;True3e;Trueo;");
}

TEST(JinjaLoops, ForElse) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}{{ x }}{% else "
                   "%}no{% endfor %}",
                   "{}"),
            "empty1");
}

TEST(JinjaLoops, ForWithCondition) {
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length "
                   "}},{% endfor %}",
                   "{}"),
            "1:1/5,3:2/5,5:3/5,7:4/5,9:5/5,");
}

TEST(JinjaLoops, ForUnpacksTuples) {
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], "
                   "(3, 4)] %}{{ a + b }}{% endfor %}",
                   "{\"d\": {\"b\": 1, \"a\": [2]}}"),
            "b=1;a=[2];37");
}

TEST(JinjaLoops, ForOverDictAndString) {
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}|{% for c in 'hé!' %}[{{ c }}]{% endfor %}",
                   "{\"d\": {\"x\": 1, \"y\": 2}}"),
            "xy|[h][é][!]");
}

TEST(JinjaLoops, BreakAndContinue) {
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 "
                   "%}{% break %}{% endif %}{{ x }}{% endfor %}",
                   "{}"),
            "0134");
}

TEST(JinjaLoops, NestedLoopsShadowLoop) {
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ "
                   "loop.index }};{% endfor %}",
                   "{}"),
            "1x2y1;1x2y2;");
}

TEST(JinjaLoops, SetInsideLoopDoesNotLeak) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }},{% "
                   "endfor %}{{ x }}",
                   "{}"),
            "111,111,1");
}

TEST(JinjaLoops, SetInsideIfLeaks) {
  EXPECT_EQ(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}", "{}"), "3");
}

TEST(JinjaLoops, FilterInForTarget) {
  EXPECT_EQ(
      render("{% for m in messages | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% "
             "endfor %}|{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
             "\"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}]}"),
      "ac|uau");
}

TEST(JinjaStatements, MacroWithDefaultsAndKeywords) {
  EXPECT_EQ(render("{% macro tag(name, body='-', close=true) %}<{{ name }}>{{ body }}{% if close "
                   "%}</{{ name }}>{% endif %}{% endmacro %}{{ tag('a') }}{{ tag('b', 'x') }}{{ "
                   "tag('c', close=false) }}{{ tag(name='d', body=1) }}",
                   "{}"),
            "<a>-</a><b>x</b><c>-<d>1</d>");
}

TEST(JinjaStatements, MacroSeesTemplateVariables) {
  EXPECT_EQ(render("{% macro greet() %}hi {{ who }}{% endmacro %}{% set who = 'bob' %}{{ greet() "
                   "}}|{{ greet() | upper }}",
                   "{}"),
            "hi bob|HI BOB");
}

TEST(JinjaStatements, MacroCallsMacro) {
  EXPECT_EQ(render("{% macro inner(x) %}[{{ x }}]{% endmacro %}{% macro outer(xs) %}{% for x in xs "
                   "%}{{ inner(x) }}{% endfor %}{% endmacro %}{{ outer([1, 2]) }}",
                   "{}"),
            "[1][2]");
}

TEST(JinjaStatements, NamespaceCarriesStateOutOfLoops) {
  EXPECT_EQ(render("{% set ns = namespace(count=0, last=none) %}{% for x in [3, 4, 5] %}{% set "
                   "ns.count = ns.count + x %}{% set ns.last = x %}{% endfor %}{{ ns.count }} {{ "
                   "ns.last }} {{ ns.missing is defined }}",
                   "{}"),
            "12 5 False");
}

TEST(JinjaStatements, BlockSet) {
  EXPECT_EQ(render("{% set x %}hello {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc{% "
                   "endset %}{{ y }}",
                   "{}"),
            "[hello 2]ABC");
}

TEST(JinjaStatements, FilterBlock) {
  EXPECT_EQ(render("{% filter upper %}abc {{ 'd' }}{% endfilter %}", "{}"), "ABC D");
}

TEST(JinjaStatements, WithBlock) {
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}", "{}"),
            "3False");
}

TEST(JinjaStatements, TupleSet) {
  EXPECT_EQ(render("{% set a, b = 1, 'x' %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}", "{}"),
            "1x(1, 2)");
}

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ "
                   "2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2.5 }} {{ 10 - 0.5 }} {{ 3 * 1.5 }} {{ 7.5 // "
                   "2 }} {{ -3 }} {{ true + 1 }}",
                   "{}"),
            "3.5 2.0 3 -4 1 2 1024 0.5 3.5 9.5 4.5 3.0 -3 2");
}

TEST(JinjaExpressions, Precedence) {
  EXPECT_EQ(
      render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ (1 + 2) ~ 3 }} "
             "{{ 'a' ~ (1 + 2) }} {{ 'a' ~ 2 * 3 }} {{ not 1 == 2 }} {{ xs|length - 1 }}",
             "{\"xs\": [1, 2, 3]}"),
      "7 9 64 4 33 a3 a6 True 2");
}

TEST(JinjaExpressions, StringAndListOperators) {
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ missing ~ "
                   "true }} {{ 'a' 'b' }}",
                   "{}"),
            "ababab [1, 1] [1, 2] a1NoneTrue ab");
}

TEST(JinjaExpressions, Comparisons) {
  EXPECT_EQ(
      render("{{ 1 < 2 < 3 }} {{ 1 < 2 > 5 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ "
             "[1, 2] < [1, 3] }} {{ none == none }} {{ 'x' != 'x' }} {{ 2 >= 2 }} {{ 1 <= 0 }}",
             "{}"),
      "True False True True True True True False True False");
}

TEST(JinjaExpressions, Membership) {
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 1 not in [1] }} {{ 'k' in d }} {{ 'v' in d }} {{ 2 in "
                   "(1, 2) }} {{ 'x' in missing }}",
                   "{\"d\": {\"k\": \"v\"}}"),
            "True False True False True False");
}

TEST(JinjaExpressions, AndOrReturnOperands) {
  EXPECT_EQ(
      render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ none or [] }} {{ '' and 1 }} {{ not [] }}", "{}"),
      "x y []  True");
}

TEST(JinjaExpressions, Ternary) {
  EXPECT_EQ(render("{{ 'yes' if x else 'no' }} {{ 'yes' if not x else 'no' }} [{{ 'only' if false "
                   "}}] {{ 1 if false else 2 if true else 3 }}",
                   "{\"x\": 1}"),
            "yes no [] 2");
}

TEST(JinjaExpressions, LiteralsListsAndDicts) {
  EXPECT_EQ(render("{{ [1, 'two', [3]] }} {{ {'a': 1, 'b': {'c': none}} }} {{ (1,) }} {{ () }} {{ "
                   "(1, 'a') }} {{ [] }} {{ {} }}",
                   "{}"),
            "[1, 'two', [3]] {'a': 1, 'b': {'c': None}} (1,) () (1, 'a') [] {}");
}

TEST(JinjaExpressions, AttributeAndSubscript) {
  EXPECT_EQ(render("{{ m.role }} {{ m['role'] }} {{ xs[0] }} {{ xs[-1] }} {{ xs.1 }} {{ m.missing "
                   "is defined }} {{ xs[5] is defined }} {{ m.get('role') }} {{ m.get('nope') }} "
                   "{{ m.get('nope', 'dflt') }}",
                   "{\"m\": {\"role\": \"user\"}, \"xs\": [10, 20, 30]}"),
            "user user 10 30 20 False False user None dflt");
}

TEST(JinjaExpressions, Slices) {
  EXPECT_EQ(render("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ "
                   "xs[5:] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'héllo'[-1] }}",
                   "{\"xs\": [1, 2, 3, 4]}"),
            "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] [3, 4] [] él olléh o");
}

TEST(JinjaExpressions, DictMethods) {
  EXPECT_EQ(render("{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ "
                   "d.items() | list }}{% for k in d.keys() %}{{ k }}{% endfor %}",
                   "{\"d\": {\"b\": 1, \"a\": true}}"),
            "[('b', 1), ('a', True)] ['b', 'a'] [1, True] [('b', 1), ('a', True)]ba");
}

TEST(JinjaStringMethods, StringStripMethods) {
  EXPECT_EQ(
      render("[{{ '  a b \\n'.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nhi\\n'.lstrip('\\n') "
             "}}][{{ 'hi  '.rstrip() }}][{{ '\u3000\u00a0hi\u2003'.strip() }}]",
             "{}"),
      "[a b][a][hi\n][hi][hi]");
}

// Python's str.isspace(): Unicode White_Space and the separators U+001C to U+001F, but
// not U+200B (a zero width space) nor the empty string.
TEST(JinjaStringMethods, IsSpaceFollowsPython) {
  EXPECT_EQ(render("{{ '\x1c\x1d\x1e\x1f'.isspace() }} {{ '\t\v\u3000\u0085'.isspace() }} "
                   "{{ '\u200b'.isspace() }} {{ ''.isspace() }} {{ ' a'.isspace() }}",
                   "{}"),
            "True True False False False");
}

TEST(JinjaStringMethods, StringSplitMethods) {
  EXPECT_EQ(render("{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
                   "{{ '  x  y '.split(None, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ "
                   "'l1\\nl2\\r\\nl3'.splitlines() }} {{ x.split('</think>')[-1] }}",
                   "{\"x\": \"<think>r</think>\\n\\nanswer\"}"),
            "['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['x', 'y '] ['a,b', 'c'] ['l1', "
            "'l2', 'l3'] \n\nanswer");
}

TEST(JinjaStringMethods, StringCaseMethods) {
  EXPECT_EQ(render("{{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Ab'.upper() }}{{ "
                   "'Ab'.lower() }} {{ 'éa'.upper() }} {{ \"they're 1st\".title() }}",
                   "{}"),
            "Hello World Hello ABab ÉA They'Re 1St");
}

// Python's full case mappings, which map some code points to several, and the final
// sigma of lower() (after a cased letter, case-ignorable ones like ' and . skipped, and
// not before one); jinja2's title filter uppercases each word's first character.
TEST(JinjaStringMethods, FullCaseMappingsAndFinalSigma) {
  EXPECT_EQ(render("{{ 'straße'.upper() }} {{ 'straße' | upper }} {{ 'ﬁx ŉ'.upper() }}", "{}"),
            "STRASSE STRASSE FIX ʼN");
  EXPECT_EQ(render("{{ 'İstanbul'.lower() }}", "{}"), "i\u0307stanbul");
  EXPECT_EQ(render("{{ 'ΟΔΟΣ ΣΑ Σ'.lower() }} {{ \"ΑΣ'.\" | lower }}", "{}"), "οδος σα σ ας'.");
  EXPECT_EQ(
      render("{{ 'ßa ǆemal'.title() }} {{ 'ǆEMAL'.capitalize() }} {{ 'ΟΔΟΣ'.title() }}", "{}"),
      "Ssa ǅemal ǅemal Οδος");
  EXPECT_EQ(render("{{ 'ﬂour ΟΔΟΣ-ǆ' | title }} {{ 'ΟΔΟΣ' | capitalize }}", "{}"),
            "FLour Οδος-Ǆ Οδος");
}

// islower() and isupper() read the Lowercase and Uppercase properties: a titlecase letter
// is neither, and cased symbols and modifier letters count.
TEST(JinjaStringMethods, IsLowerAndIsUpperReadTheCaseProperties) {
  const char* strings[] = {"ǅ", "ª", "Ⓐ", "aǅ", "1a", "ABC1", "", "🄰", "ⓐ", "ʰ"};
  const char* python[] = {"FF", "TF", "FT", "FF", "TF", "FT", "FF", "FT", "TF", "TF"};
  for (size_t i = 0; i < std::size(strings); ++i) {
    const std::string s = strings[i];
    const std::string got = render(
        "{{ 'T' if '" + s + "'.islower() else 'F' }}{{ 'T' if '" + s + "'.isupper() else 'F' }}",
        "{}");
    EXPECT_EQ(got, python[i]) << s;
  }
}

TEST(JinjaStringMethods, StringSearchMethods) {
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.startswith(('x', 'a')) }} {{ "
                   "'abc'.endswith('bc') }} {{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ "
                   "'banana'.count('an') }} {{ 'a-b'.replace('-', '+') }} {{ 'aaa'.replace('a', "
                   "'b', 2) }} {{ ', '.join(['x', 'y']) }} {{ '12'.isdigit() }}",
                   "{}"),
            "True True True 2 -1 2 a+b bba x, y True");
}

TEST(JinjaFilters, FilterTrimLengthCase) {
  EXPECT_EQ(render("[{{ '  x \u3000' | trim }}] {{ 'héllo' | length }} {{ [1, 2] | count }} {{ "
                   "{'a': 1} | length }} {{ 'aBc' | upper }} {{ 'aBc' | lower }} {{ 'hello-world "
                   "foo(bar' | title }} {{ 'hELLO wORLD' | capitalize }}",
                   "{}"),
            "[x] 5 2 1 ABC abc Hello-World Foo(Bar Hello world");
}

TEST(JinjaFilters, FilterDefault) {
  EXPECT_EQ(render("{{ missing | default('d') }} {{ none | default('d') }} {{ '' | default('d') }} "
                   "{{ '' | default('d', true) }} {{ missing | d('x') }} [{{ missing | default }}]",
                   "{}"),
            "d None  d x []");
}

TEST(JinjaFilters, FilterFirstLastJoin) {
  EXPECT_EQ(render("{{ xs | first }} {{ xs | last }} {{ 'abc' | first }} {{ xs | join(', ') }} {{ "
                   "xs | join }} {{ people | join('/', attribute='name') }}",
                   "{\"xs\": [1, 2, 3], \"people\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}"),
            "1 3 a 1, 2, 3 123 a/b");
}

TEST(JinjaFilters, FilterMapSelect) {
  EXPECT_EQ(render("{{ people | map(attribute='name') | list }} {{ ['a', 'b'] | map('upper') | "
                   "join }} {{ range(6) | select('odd') | list }} {{ range(6) | reject('odd') | "
                   "list }} {{ people | selectattr('admin') | map(attribute='name') | list }} {{ "
                   "people | rejectattr('admin') | list | length }} {{ people | selectattr('name', "
                   "'equalto', 'b') | list }} {{ [0, 1, '', 'x'] | select | list }}",
                   "{\"people\": [{\"name\": \"a\", \"admin\": true}, {\"name\": \"b\"}]}"),
            "['a', 'b'] AB [1, 3, 5] [0, 2, 4] ['a'] 1 [{'name': 'b'}] [1, 'x']");
}

TEST(JinjaFilters, FilterItemsListSort) {
  EXPECT_EQ(render("{{ d | items | list }} {{ 'ab' | list }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', "
                   "'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ people | "
                   "sort(attribute='age') | map(attribute='n') | join }} {{ [1, 2, 1, 3] | unique "
                   "| list }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }}",
                   "{\"d\": {\"x\": 1, \"y\": [2]}, \"people\": [{\"n\": \"a\", \"age\": 3}, "
                   "{\"n\": \"b\", \"age\": 1}]}"),
            "[('x', 1), ('y', [2])] ['a', 'b'] [1, 2, 3] ['A', 'b', 'c'] [3, 2, 1] ba [1, 2, 3] "
            "[2, 1] cba");
}

TEST(JinjaFilters, FilterNumbers) {
  EXPECT_EQ(render("{{ [1, 2, 3] | sum }} {{ [1, 2.5] | sum }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] "
                   "| max }} {{ '42' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ '1.5' | float }} "
                   "{{ 2 | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ -3 | abs }} {{ 42 "
                   "| string }} {{ 'x' ~ (1.0 | string) }}",
                   "{}"),
            "6 3.5 1 3 42 0 3 1.5 2.0 2.57 2.0 3 42 x1.0");
}

// Python's rounding (an int stays an int; a float rounds from its exact value) and
// float() (no hexadecimal).
TEST(JinjaFilters, RoundAndIntAsPython) {
  EXPECT_EQ(
      render("{{ 1 | round }} {{ 15 | round(-1) }} {{ 25 | round(-1) }} {{ 2.675 | round(2) "
             "}} {{ 0.125 | round(2) }} {{ 1.5 | round }} {{ -2.5 | round }} {{ 2.5 | "
             "round(method='ceil') }} {{ '0x1A' | int }} {{ ' 12 ' | int }} {{ '1e3' | int }}",
             "{}"),
      "1 20 20 2.67 0.12 2.0 -2.0 3.0 0 12 1000");
}

// Integers past 64 bits are an error, not a wrapped value; ** squares (no loop of b
// steps), and a repetition's size is capped.
TEST(JinjaExpressions, IntegerOverflowIsAnError) {
  EXPECT_EQ(
      render("{{ 2 ** 62 }} {{ -9223372036854775807 - 1 }} {{ (-9223372036854775807 - 1) % -1 "
             "}} {{ 3 ** 0 }}",
             "{}"),
      "4611686018427387904 -9223372036854775808 0 1");
  for (const char* source :
       {"{{ 9223372036854775807 + 1 }}", "{{ 2 ** 64 }}", "{{ 2 ** 10000000000 }}",
        "{{ -9223372036854775807 - 2 }}", "{{ 4294967296 * 4294967296 }}",
        "{{ (-9223372036854775807 - 1) // -1 }}", "{{ -(-9223372036854775807 - 1) }}"}) {
    EXPECT_NE(error_of(source).find("integer overflow"), std::string::npos) << source;
  }
  EXPECT_NE(error_of("{{ 'ab' * 100000000 }}").find("repetition too large"), std::string::npos);
}

// A macro that calls itself without end (as a tool-use template walking a string it took
// for a schema can) is an error, as jinja2's RecursionError, not a stack overflow.
TEST(JinjaStatements, EndlessMacroRecursionIsAnError) {
  EXPECT_NE(error_of("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}")
                .find("maximum recursion depth exceeded"),
            std::string::npos);
  // jinja2 itself stops between 150 and 200 levels; 150 render.
  EXPECT_EQ(render("{%- macro f(n) -%}{%- if n > 0 -%}{{ f(n - 1) }}{%- endif -%}x{%- endmacro "
                   "-%}{{ f(150) | length }}",
                   "{}"),
            "151");
}

// Python's float floor division and modulo: fmod with the sign of the divisor.
TEST(JinjaExpressions, FloatFloorDivisionAndModuloAsPython) {
  EXPECT_EQ(render("{{ 1 // 0.1 }}|{{ 1 % 0.1 }}|{{ 1.0 % 0.3 }}|{{ -3.0 // 0.3 }}|{{ -7.5 % 2 "
                   "}}|{{ 7.5 % -2 }}|{{ -0.0 % 5 }}|{{ 6.0 % 3 }}|{{ -6.0 % 3 }}|{{ 6.0 % -3 }}",
                   "{}"),
            "9.0|0.09999999999999995|0.10000000000000003|-11.0|0.5|-0.5|0.0|0.0|0.0|-0.0");
}

// Python's str.splitlines breaks at every line boundary it knows, and indent with it.
TEST(JinjaStringMethods, SplitlinesBreaksWherePythonDoes) {
  EXPECT_EQ(render("{{ s.splitlines() }}|{{ 'a\u2028b' | indent(2) }}",
                   "{\"s\": \"a\\u0085b\\fc\\u000bd\\u001ce\\u2029f\\r\\ng\"}"),
            "['a', 'b', 'c', 'd', 'e', 'f', 'g']|a\n  b");
}

// A {% set %} inside a set or filter block stays inside it, as in jinja2.
TEST(JinjaStatements, SetInsideABlockStaysInside) {
  EXPECT_EQ(render("{% set y %}{% set inner = 5 %}{{ inner }}{% endset %}{{ y }}[{{ inner }}]"
                   "{% filter upper %}{% set z = 'q' %}{{ z }}{% endfilter %}[{{ z }}]",
                   "{}"),
            "5[]Q[]");
}

// find and index take start and end; rsplit(None, n) splits at the right.
TEST(JinjaStringMethods, FindTakesStartAndEndAndRsplitWithoutSeparator) {
  EXPECT_EQ(render("{{ 'a b, c'.find('b', 3) }} {{ 'a b, c'.find('b', 1) }} {{ 'abcb'.find('b', 0, "
                   "1) }} {{ 'abcb'.find('b', -2) }} {{ 'abc'.index('c', 1, 3) }} {{ '  a b c  "
                   "'.rsplit(None, 1) }} {{ 'a b c'.rsplit() }} {{ ' a  b '.rsplit(None, 5) }}",
                   "{}"),
            "-1 2 -1 3 2 ['  a b', 'c'] ['a', 'b', 'c'] ['a', 'b']");
}

// transformers' tojson takes (ensure_ascii, indent, separators, sort_keys) in that order.
TEST(JinjaFilters, ToJsonPositionalArgumentsAreTransformersOrder) {
  EXPECT_EQ(
      render(
          "{{ {'a': 'é'} | tojson(false, 2) }}|{{ {'a': 'é', 'b': [1]} | "
          "tojson(ensure_ascii=true) }}|{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', "
          "':')) }}|{{ {'a': [1]} | tojson(indent=1, separators=(',', ' = ')) }}|{{ '\U0001F600' | "
          "tojson(true) }}",
          "{}"),
      "{\n  \"a\": \"é\"\n}|{\"a\": \"\\u00e9\", \"b\": [1]}|{\"b\":1,\"a\":[1,2]}|{\n \"a\" "
      "= [\n  1\n ]\n}|\"\\ud83d\\ude00\"");
}

// Numbers a request can send that an int64 cannot hold are an error, not a wrapped value.
TEST(JinjaExpressions, IntegersPast64BitsFromJsonOrFloatsAreAnError) {
  EXPECT_NE(error_of("{{ v }}", "{\"v\": 9223372036854775808}").find("integer overflow"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 1e300 | int }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(render("{{ v }} {{ 9.2e18 | int }} {{ -1e18 | int }} {{ 'inf' | float }} {{ '1e400' | "
                   "float }} {{ '1_000' | int }} {{ '0x10' | float }}",
                   "{\"v\": 9223372036854775807}"),
            "9223372036854775807 9200000000000000000 -1000000000000000000 inf inf 1000 0.0");
}

// The rest of what jinja2 does differently at the edges: a default that calls its own
// macro, DEL under ensure_ascii, indent=true, Unicode digits and White_Space in int and
// float, a bool start past the end, keepends, a float maxsplit.
TEST(JinjaExpressions, EdgesOfMacrosJsonNumbersAndStrings) {
  EXPECT_NE(error_of("{% macro m(x=m()) %}{% endmacro %}{{ m() }}")
                .find("maximum recursion depth exceeded"),
            std::string::npos);
  EXPECT_EQ(render("{{ s | tojson(true) }}|{{ s | tojson }}|{{ [1] | tojson(indent=true) }}",
                   "{\"s\": \"a\\u007f\u00e9\"}"),
            "\"a\\u007f\\u00e9\"|\"a\x7f\u00e9\"|[\n 1\n]");
  EXPECT_EQ(
      render("{{ a | int }}|{{ b | int }}|{{ c | float }}|{{ d | int }}",
             "{\"a\": \"\\u001c5\", \"b\": \"\uff11\uff12\", \"c\": \" \uff11.\uff15\u3000\", "
             "\"d\": \"\u0663\"}"),
      "0|12|1.5|3");
  EXPECT_EQ(render("{{ ''.find('', true) }}|{{ 'ab'.find('', true) }}|{{ s.splitlines(true) }}|{{ "
                   "'a\\rb'.splitlines(keepends=true) }}",
                   "{\"s\": \"a\\r\\nb\\nc\"}"),
            "-1|1|['a\\r\\n', 'b\\n', 'c']|['a\\r', 'b']");
  EXPECT_NE(error_of("{{ 'a b'.rsplit(None, 1.5) }}").find("cannot be interpreted as an integer"),
            std::string::npos);
}

TEST(JinjaFilters, FilterIndent) {
  EXPECT_EQ(render("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' "
                   "| indent(width=1, blank=true) }}",
                   "{}"),
            "a\n  b\n\n  c|  a\n  b|a\n \n b");
}

TEST(JinjaFilters, FilterDictsortAndAttr) {
  EXPECT_EQ(render("{{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ m | attr('role') }}",
                   "{\"d\": {\"b\": 1, \"a\": 2}, \"m\": {\"role\": \"user\"}}"),
            "[('a', 2), ('b', 1)] [('b', 1), ('a', 2)] ");
}

TEST(JinjaFilters, FilterToJson) {
  EXPECT_EQ(render("{{ v | tojson }}|{{ 'é\"\\\\\\n\\t\\u0001' | tojson }}|{{ [1.0, 1e20, 0.5, "
                   "-0.0, 100] | tojson }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ v | "
                   "tojson(indent=2) }}|{{ [] | tojson(indent=2) }}",
                   "{\"v\": {\"name\": \"f\", \"args\": {\"x\": [1, null, true], \"y\": "
                   "\"\u2028\"}, \"empty\": {}}}"),
            "{\"name\": \"f\", \"args\": {\"x\": [1, null, true], \"y\": \"\u2028\"}, \"empty\": "
            "{}}|\"é\\\"\\\\\\n\\t\\u0001\"|[1.0, 1e+20, 0.5, -0.0, 100]|{\"a\": 2, \"b\": 1}|{\n  "
            "\"name\": \"f\",\n  \"args\": {\n    \"x\": [\n      1,\n      null,\n      true\n    "
            "],\n    \"y\": \"\u2028\"\n  },\n  \"empty\": {}\n}|[]");
}

TEST(JinjaTests, Tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ none is none }}{{ "
                   "'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ 1 "
                   "is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ "
                   "true is true }}{{ 0 is false }}{{ false is false }}{{ {} is mapping }}{{ [] is "
                   "iterable }}{{ 'a' is sequence }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is "
                   "divisibleby 3 }}{{ 1 is eq 1 }}{{ 2 is in [1, 2] }}{{ none is sameas none }}{{ "
                   "'ab' is lower }}{{ 'AB' is upper }}{{ x is not none }}{{ range is callable }}",
                   "{\"x\": 1}"),
            "TrueFalseTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTru"
            "eTrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaPrinting, PythonLikePrinting) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': (1,)}] }} {{ 1.0 }} {{ 1e20 }} {{ 1e16 }} "
                   "{{ 1e15 }} {{ 0.1 + 0.2 }} {{ 1e-7 }} {{ 0.0001 }} {{ -0.0 }} {{ none }} {{ "
                   "false }} {{ 12345678901234 }}",
                   "{}"),
            "[1, 'a', None, True, 1.5, {'k': (1,)}] 1.0 1e+20 1e+16 1000000000000000.0 "
            "0.30000000000000004 1e-07 0.0001 -0.0 None False 12345678901234");
}

TEST(JinjaPrinting, PythonLikeStringRepr) {
  EXPECT_EQ(render("{{ ['a\\nb', \"it's\", 'both\\'\"', 'tab\\t', 'back\\\\slash', 'é', '\\x7f', "
                   "'\\u2028', '\\u00a0'] }}",
                   "{}"),
            "['a\\nb', \"it's\", 'both\\'\"', 'tab\\t', 'back\\\\slash', 'é', '\\x7f', '\\u2028', "
            "'\\xa0']");
}

TEST(JinjaPrinting, JsonValuesPrintLikePython) {
  EXPECT_EQ(render("{{ m }} {{ m.args }} {{ m.n }} {{ m.f }} {{ m.b }} {{ m.z }}",
                   "{\"m\": {\"args\": {\"a\": [1, \"x\"]}, \"n\": 3, \"f\": 2.0, \"b\": false, "
                   "\"z\": null}}"),
            "{'args': {'a': [1, 'x']}, 'n': 3, 'f': 2.0, 'b': False, 'z': None} {'a': [1, 'x']} 3 "
            "2.0 False None");
}

TEST(JinjaUndefined, UndefinedIsLenient) {
  EXPECT_EQ(render("[{{ missing }}]{{ missing is defined }}{% for x in missing %}x{% endfor %}{{ "
                   "missing | length }}{% if missing %}t{% else %}f{% endif %}{{ missing == "
                   "missing }}{{ missing | trim }}{{ missing | string }}|{{ none.x is defined }}",
                   "{}"),
            "[]False0fTrue|False");
}

TEST(JinjaUndefined, MissingDictKeyIsUndefined) {
  EXPECT_EQ(render("{% if m.tool_calls %}calls{% else %}none{% endif %} {{ m.reasoning_content is "
                   "defined and m.reasoning_content is not none }} {{ m['x'] | default('dflt') }}",
                   "{\"m\": {\"role\": \"user\"}}"),
            "none False dflt");
}
// --- errors --------------------------------------------------------------------------

TEST(JinjaErrors, UnsupportedFilterNamedWithLine) {
  EXPECT_EQ(error_of("a\n\n{{ x | wordwrap(3) }}"), "unsupported filter 'wordwrap' at line 3");
  EXPECT_EQ(error_of("{{ xs | map('wordwrap') | list }}", R"({"xs": ["a"]})"),
            "unsupported filter 'wordwrap' at line 1");
}

TEST(JinjaErrors, UnsupportedTestNamedWithLine) {
  EXPECT_EQ(error_of("\n{% if x is escaped %}{% endif %}"), "unsupported test 'escaped' at line 2");
}

TEST(JinjaErrors, UnsupportedTagsNamedWithLine) {
  EXPECT_EQ(error_of("{% include 'other.jinja' %}"), "unsupported tag 'include' at line 1");
  EXPECT_EQ(error_of("x\n{% call foo() %}{% endcall %}"), "unsupported tag 'call' at line 2");
  EXPECT_EQ(error_of("{% do xs.append(1) %}"), "unsupported tag 'do' at line 1");
  EXPECT_EQ(error_of("{% frobnicate %}"), "unknown tag 'frobnicate' at line 1");
  EXPECT_EQ(error_of("{% for x in xs recursive %}{% endfor %}"),
            "unsupported recursive for loop at line 1");
}

TEST(JinjaErrors, UnsupportedMethodAndFunctionNamed) {
  EXPECT_EQ(error_of("\n{{ 'x'.zfill(3) }}"), "unsupported method 'zfill' of str at line 2");
  EXPECT_EQ(error_of("{{ xs.append(1) }}", R"({"xs": []})"),
            "unsupported method 'append' of list at line 1");
  EXPECT_EQ(error_of("{{ lipsum(2) }}"),
            "unsupported function or undefined name 'lipsum' at line 1");
}

TEST(JinjaErrors, SyntaxErrorsGiveTheLine) {
  EXPECT_EQ(error_of("ok\n{{ 1 + }}"), "syntax error: expected an expression, got '}}' at line 2");
  EXPECT_EQ(error_of("{% if x %}\n\n{% endfor %}"), "unexpected tag 'endfor' at line 3");
  EXPECT_EQ(error_of("{% if x %}\nno end"),
            "unexpected end of template: 'if' opened at line 1 is never closed at line 2");
  EXPECT_EQ(error_of("{{ 'abc }}"), "unterminated string literal at line 1");
  EXPECT_EQ(error_of("{{ x "), "unexpected end of template, missing '}}' at line 1");
  EXPECT_EQ(error_of("{# open comment"), "missing end of comment tag at line 1");
  EXPECT_EQ(error_of("{{ (1 }}"), "unexpected '}', expected ')' at line 1");
  EXPECT_EQ(error_of("{% break %}"), "'break' outside of a loop at line 1");
}

TEST(JinjaErrors, UndefinedUsedAsValue) {
  EXPECT_EQ(error_of("{{ missing.attr }}"), "'missing' is undefined at line 1");
  EXPECT_EQ(error_of("{{ m.a.b }}", R"({"m": {}})"),
            "'dict object' has no attribute 'a' at line 1");
  EXPECT_EQ(error_of("{{ missing + 1 }}"), "'missing' is undefined at line 1");
  EXPECT_EQ(error_of("{{ missing > 1 }}"), "'missing' is undefined at line 1");
}

TEST(JinjaErrors, PythonTypeErrors) {
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "can only concatenate str (not \"int\") to str at line 1");
  EXPECT_EQ(error_of("{{ 1 / 0 }}"), "division by zero at line 1");
  EXPECT_EQ(error_of("{{ 1 < 'a' }}"),
            "'<' not supported between instances of 'int' and 'str' at line 1");
  EXPECT_EQ(error_of("{% for x in 3 %}{% endfor %}"), "'int' object is not iterable at line 1");
  EXPECT_EQ(error_of("{{ x | tojson }}", "{}"),
            "Object of type Undefined is not JSON serializable at line 1");
  EXPECT_EQ(error_of("{% set a, b = [1] %}"), "not enough values to unpack at line 1");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplatesMessage) {
  EXPECT_EQ(error_of("{% if true %}{{ raise_exception('Only user and assistant roles are "
                     "supported!') }}{% endif %}"),
            "Only user and assistant roles are supported!");
}

TEST(JinjaGlobals, StrftimeNowFormatsTheCurrentDate) {
  const std::string year = render("{{ strftime_now('%Y') }}", "{}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(JinjaGlobals, RangeAndDict) {
  EXPECT_EQ(render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1) }}", "{}"),
            "[0, 1, 2] [1, 3, 5] {'a': 1}");
}

}  // namespace
}  // namespace pagellm::engine::jinja
