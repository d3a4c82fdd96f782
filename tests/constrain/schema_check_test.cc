// CheckConstraint (constrain/schema_check.h): each refused construct named with where it is, each
// limit, and the schemas, regexes, grammars and structural tags that pass, among them the
// customer-service schemas in tests/data/schemas.
#include "constrain/schema_check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "constrain/constraint.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

using Kind = ConstraintSpec::Kind;
constexpr char kField[] = "response_format.json_schema.schema";

ConstraintSpec Spec(Kind kind, std::string text) {
  ConstraintSpec spec;
  spec.kind = kind;
  spec.text = std::move(text);
  spec.field = kField;
  return spec;
}

// A schema whose root holds `levels` schemas nested through `items` (the root is level 1).
std::string NestedItems(int levels) {
  std::string text = R"({"type":"string"})";
  for (int i = 1; i < levels; ++i) text = R"({"type":"array","items":)" + text + "}";
  return text;
}

// Compiles an accepted constraint on the TinyStories vocabulary. The compiler turns any warning
// xgrammar logs (it ignored part of the input) into a refusal, so OK means it compiled with none.
absl::Status CompileWithoutWarning(const ConstraintSpec& spec) {
  static const ConstraintCompiler* compiler = [] {
    auto tok = LoadTokenizer(testing::TinyStoriesDir() + "/tok512.bin", 512);
    EXPECT_TRUE(tok.ok()) << tok.status();
    return ConstraintCompiler::Create(MakeConstraintVocab(**tok, 512, (*tok)->eos_ids())).release();
  }();
  return compiler->Compile(spec).status();
}

// root ::= r0, then rule k repeating the next twice: the chain whose compile time grows fastest.
std::string RuleChain(int rules, const std::string& repeat) {
  std::string text = "root ::= r0\n";
  for (int k = 0; k + 2 < rules; ++k) {
    const std::string next = "r" + std::to_string(k + 1);
    text += "r" + std::to_string(k) + " ::= (" + next + " \",\" " + next + ")" + repeat + " | \"x\"\n";
  }
  return text + "r" + std::to_string(std::max(rules - 2, 0)) + " ::= \"end\"\n";
}

std::string Repeated(const std::string& piece, int n, const std::string& separator = ",") {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i > 0 ? separator : "") + piece;
  return out;
}

// An object schema with `n` integer properties p0, p1, ...
std::string ManyProperties(int n) {
  std::string props;
  for (int i = 0; i < n; ++i) props += (i > 0 ? "," : "") + ("\"p" + std::to_string(i) + "\":{\"type\":\"integer\"}");
  return R"({"type":"object","properties":{)" + props + "}}";
}

struct BadCase {
  std::string name;
  Kind kind;
  std::string text;
  std::string expected;  // a substring of the message, after "<field>: "
};

std::string CaseName(const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; }
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class RefusedTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(RefusedTest, IsInvalidArgumentNamingFieldAndConstruct) {
  const BadCase& c = GetParam();
  const absl::Status status = CheckConstraint(Spec(c.kind, c.text), ConstraintLimits{});
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.text;
  EXPECT_EQ(status.message().rfind(std::string(kField) + ": ", 0), 0u) << status.message();
  EXPECT_NE(status.message().find(c.expected), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << c.expected;
}

// Keywords xgrammar ignores (with a warning or silently), refused by name with their pointer.
INSTANTIATE_TEST_SUITE_P(
    Keywords, RefusedTest,
    ::testing::Values(
        BadCase{"OneOf", Kind::kJsonSchema,
                R"({"type":"object","properties":{"address":{"oneOf":[{"type":"string"},{"type":"integer"}]}}})",
                "'oneOf' at /properties/address is not supported"},
        BadCase{"Not", Kind::kJsonSchema, R"({"type":"string","not":{"const":"x"}})", "'not' at / is not supported"},
        BadCase{"If", Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"type":"object","if":{}}}})",
                "'if' at /properties/a is not supported"},
        BadCase{"ThenElse", Kind::kJsonSchema, R"({"type":"object","then":{},"else":{}})",
                "'else' at / is not supported"},
        BadCase{"DependentRequired", Kind::kJsonSchema, R"({"type":"object","dependentRequired":{"a":["b"]}})",
                "'dependentRequired' at / is not supported"},
        BadCase{"DependentSchemas", Kind::kJsonSchema, R"({"type":"object","dependentSchemas":{"a":{}}})",
                "'dependentSchemas' at / is not supported"},
        BadCase{"UniqueItems", Kind::kJsonSchema,
                R"({"type":"object","properties":{"tags":{"type":"array","uniqueItems":true}}})",
                "'uniqueItems' at /properties/tags is not supported"},
        BadCase{"Contains", Kind::kJsonSchema, R"({"type":"array","contains":{"type":"integer"}})",
                "'contains' at / is not supported"},
        BadCase{"MinContains", Kind::kJsonSchema, R"({"type":"array","items":{"type":"array","minContains":1}})",
                "'minContains' at /items is not supported"},
        BadCase{"MaxContains", Kind::kJsonSchema, R"({"type":"array","maxContains":2})",
                "'maxContains' at / is not supported"},
        BadCase{"Anchor", Kind::kJsonSchema, R"({"$anchor":"a","type":"string"})", "'$anchor' at / is not supported"},
        BadCase{"AdditionalItems", Kind::kJsonSchema, R"({"type":"array","additionalItems":false})",
                "'additionalItems' at / is not supported"},
        BadCase{"NestedId", Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"$id":"x","type":"string"}}})",
                "'$id' at /properties/a is not supported"},
        BadCase{"RefToAnotherDocument", Kind::kJsonSchema,
                R"({"type":"object","properties":{"a":{"$ref":"other.json#/a"}}})",
                "'$ref' 'other.json#/a' at /properties/a is not supported"},
        BadCase{"RefThatResolvesNowhere", Kind::kJsonSchema,
                R"({"$defs":{"a":{"type":"string"}},"type":"object","properties":{"b":{"$ref":"#/$defs/missing"}}})",
                "'$ref' '#/$defs/missing' at /properties/b names no schema"},
        BadCase{"RefIntoAnAnnotation", Kind::kJsonSchema,
                R"({"type":"object","default":{"x":{"type":"string"}},"properties":{"b":{"$ref":"#/default/x"}}})",
                "'$ref' '#/default/x' at /properties/b names no schema"},
        BadCase{"RefCycle", Kind::kJsonSchema,
                R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
                "in a cycle of $refs"},
        BadCase{"SiblingOfRef", Kind::kJsonSchema,
                R"({"$defs":{"a":{"type":"object"}},"$ref":"#/$defs/a","required":["x"]})",
                "'required' beside '$ref' at / is not supported"},
        BadCase{"AllOfTwoBranches", Kind::kJsonSchema, R"({"allOf":[{"type":"object"},{"required":["a"]}]})",
                "'allOf' with 2 branches at / is not supported"},
        BadCase{"SiblingOfAnyOf", Kind::kJsonSchema,
                R"({"anyOf":[{"type":"string"},{"type":"null"}],"properties":{"a":{}}})",
                "'properties' beside 'anyOf' at / is not supported"},
        BadCase{"SiblingOfEnum", Kind::kJsonSchema, R"({"type":"string","enum":["a","b"],"pattern":"^a$"})",
                "'pattern' beside 'enum' at / is not supported"},
        BadCase{"EnumBesideConst", Kind::kJsonSchema, R"({"const":"a","enum":["a"]})", "'enum' beside 'const' at /"},
        BadCase{"MultipleOfOnNumber", Kind::kJsonSchema,
                R"({"type":"object","properties":{"price":{"type":"number","multipleOf":0.01}}})",
                "'multipleOf' at /properties/price is not supported on type 'number'"},
        BadCase{"MultipleOfWithRange", Kind::kJsonSchema,
                R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":100,"multipleOf":5}}})",
                "'multipleOf' beside 'minimum' at /properties/n is not supported"},
        BadCase{"MultipleOfPastTheAutomaton", Kind::kJsonSchema, R"({"type":"integer","multipleOf":2000})",
                "'multipleOf' at / is not a whole number from 1 to 1024"},
        BadCase{"UnknownFormat", Kind::kJsonSchema,
                R"({"type":"object","properties":{"card":{"type":"string","format":"credit-card"}}})",
                R"('format' "credit-card" at /properties/card is not supported)"},
        BadCase{"FormatWithLength", Kind::kJsonSchema,
                R"({"type":"object","properties":{"email":{"type":"string","format":"email","maxLength":30}}})",
                "'maxLength' beside 'format' at /properties/email is not supported"},
        BadCase{"PatternWithLength", Kind::kJsonSchema,
                R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]+$","minLength":2}}})",
                "'minLength' beside 'pattern' at /properties/code is not supported"},
        BadCase{"PatternWithFormat", Kind::kJsonSchema, R"({"type":"string","pattern":"^a","format":"date"})",
                "'pattern' beside 'format' at / is not supported"},
        BadCase{"KeywordOfAnotherType", Kind::kJsonSchema, R"({"type":"string","minimum":1})",
                "'minimum' at / does not apply to type 'string'"},
        BadCase{"KeywordWithoutType", Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"pattern":"^x$"}}})",
                "'pattern' at /properties/a is not supported without a 'type'"},
        BadCase{"UnevaluatedItemsBesideItems", Kind::kJsonSchema,
                R"({"type":"array","items":{"type":"string"},"unevaluatedItems":false})",
                "'unevaluatedItems' beside 'items' at / is not supported"},
        BadCase{"DraftSevenTupleItems", Kind::kJsonSchema, R"({"type":"array","items":[{"type":"string"}]})",
                "'items' at / is not a schema"},
        BadCase{"EscapedPointer", Kind::kJsonSchema,
                R"({"type":"object","properties":{"a/b~c":{"type":"string","not":{}}}})",
                "'not' at /properties/a~1b~0c is not supported"}),
    CaseName);

// Limits and values that xgrammar would refuse, or that leave no value.
INSTANTIATE_TEST_SUITE_P(
    Limits, RefusedTest,
    ::testing::Values(
        BadCase{"TextSize", Kind::kJsonSchema, R"({"type":"string","description":")" + std::string(40000, 'x') + "\"}",
                "the json_schema is 40034 bytes, more than the limit of 32768"},
        BadCase{"NotJson", Kind::kJsonSchema, R"({"type": "string",})", "not valid JSON at byte 18"},
        BadCase{"FalseRoot", Kind::kJsonSchema, "false", "the schema is not a JSON object or true"},
        BadCase{
            "SchemaNesting", Kind::kJsonSchema, NestedItems(13),
            "the schema at /items/items/items/items/items/items/items/items/items/items/items/items is nested deeper "
            "than the limit of 12"},
        BadCase{"JsonNesting", Kind::kJsonSchema, std::string(16000, '[') + std::string(16000, ']'),
                "the JSON at byte 52 is nested deeper than the limit of 52 levels"},
        BadCase{"EnumValues", Kind::kJsonSchema,
                R"({"type":"object","properties":{"color":{"enum":[)" + Repeated("1", 257) + "]}}}",
                "'enum' at /properties/color has 257 values, more than the limit of 256"},
        BadCase{"MinItems", Kind::kJsonSchema,
                R"({"type":"object","properties":{"list":{"type":"array","minItems":65}}})",
                "'minItems' 65 at /properties/list is more than the limit of 64"},
        BadCase{"MaxLength", Kind::kJsonSchema,
                R"({"type":"object","properties":{"name":{"type":"string","maxLength":100}}})",
                "'maxLength' 100 at /properties/name is more than the limit of 64"},
        BadCase{"MinLengthAboveMaxLength", Kind::kJsonSchema, R"({"type":"string","minLength":5,"maxLength":3})",
                "'minLength' 5 is greater than 'maxLength' 3 at /"},
        BadCase{"Properties", Kind::kJsonSchema, ManyProperties(129),
                "the object at / has 129 properties, more than the limit of 128"},
        BadCase{"MinimumAboveMaximum", Kind::kJsonSchema,
                R"({"type":"object","properties":{"n":{"type":"integer","minimum":10,"maximum":1}}})",
                "'minimum' 10 is greater than 'maximum' 1 at /properties/n"},
        BadCase{"ExclusiveBoundsMeet", Kind::kJsonSchema, R"({"type":"number","exclusiveMinimum":1,"maximum":1})",
                "the bounds at / leave no value between them"},
        BadCase{"FractionalIntegerBound", Kind::kJsonSchema, R"({"type":"integer","maximum":2.5})",
                "'maximum' at / is not a whole number"},
        BadCase{"RequiredButForbidden", Kind::kJsonSchema,
                R"({"type":"object","properties":{"a":{}},"required":["a","b"],"additionalProperties":false})",
                "'required' names 'b' at /, which 'additionalProperties: false' forbids"},
        BadCase{"RequiredButUnlisted", Kind::kJsonSchema, R"({"type":"object","required":["b"]})",
                "'required' names 'b' at /, which 'properties' does not list"},
        BadCase{"UnknownType", Kind::kJsonSchema, R"({"type":"object","properties":{"d":{"type":"date"}}})",
                "'type' date at /properties/d is not a JSON Schema type"},
        BadCase{"ConstOfAnotherType", Kind::kJsonSchema, R"({"type":"integer","const":"1"})",
                "'const' at / is not of the schema's 'type'"},
        BadCase{"EnumValueOfAnotherType", Kind::kJsonSchema, R"({"type":"string","enum":["a",2]})",
                "'enum' value 1 at / is not of the schema's 'type'"},
        BadCase{"PatternWithLookahead", Kind::kJsonSchema,
                R"j({"type":"object","properties":{"p":{"type":"string","pattern":"a(?=b)"}}})j",
                "'pattern' at /properties/p: lookahead '(?=' at byte 1 is not supported"},
        BadCase{"PatternPropertiesKey", Kind::kJsonSchema,
                R"({"type":"object","patternProperties":{"^(a)\\1$":{"type":"string"}}})",
                R"('patternProperties' key '^(a)\1$' at /: backreference '\1' at byte 4 is not supported)"},
        BadCase{"PropertyNamesOfIntegers", Kind::kJsonSchema, R"({"type":"object","propertyNames":{"type":"integer"}})",
                "'propertyNames' at / is not a schema of strings"},
        BadCase{"AnyOfBranches", Kind::kJsonSchema, R"({"anyOf":[)" + Repeated(R"({"type":"null"})", 257) + "]}",
                "'anyOf' at / has 257 branches, more than the limit of 256"},
        BadCase{"PrefixItems", Kind::kJsonSchema, R"({"type":"array","prefixItems":[)" + Repeated("{}", 65) + "]}",
                "'prefixItems' at / has 65 schemas, more than the limit of 64"},
        BadCase{"MaxItemsBelowPrefixItems", Kind::kJsonSchema, R"({"type":"array","prefixItems":[{},{}],"maxItems":1})",
                "'maxItems' 1 at / is fewer than its 2 'prefixItems'"},
        BadCase{"MaxProperties", Kind::kJsonSchema, R"({"type":"object","maxProperties":129})",
                "'maxProperties' 129 at / is more than the limit of 128"},
        BadCase{"NegativeCount", Kind::kJsonSchema, R"({"type":"array","minItems":-1})",
                "'minItems' at / is not a non-negative integer"},
        BadCase{"FalseProperty", Kind::kJsonSchema, R"({"type":"object","properties":{"a":false}})",
                "the schema 'false' at /properties/a accepts nothing"},
        BadCase{"TypeListedTwice", Kind::kJsonSchema, R"({"type":["string","string"]})",
                "'type' at / lists 'string' twice"},
        BadCase{"EmptyAnyOf", Kind::kJsonSchema, R"({"anyOf":[]})", "'anyOf' at / is not a non-empty array"}),
    CaseName);

INSTANTIATE_TEST_SUITE_P(
    Regex, RefusedTest,
    ::testing::Values(
        BadCase{"Repetition", Kind::kRegex, "a{65}", "repetition '{65}' at byte 1 is more than the limit of 64"},
        BadCase{"RepetitionRange", Kind::kRegex, "^[0-9]{1,100}$",
                "repetition '{1,100}' at byte 6 is more than the limit of 64"},
        BadCase{"Backreference", Kind::kRegex, R"((a)\1)", R"(backreference '\1' at byte 3 is not supported)"},
        BadCase{"NamedBackreference", Kind::kRegex, R"((?<x>a)\k<x>)",
                R"(backreference '\k' at byte 7 is not supported)"},
        BadCase{"Lookahead", Kind::kRegex, "a(?=b)", "lookahead '(?=' at byte 1 is not supported"},
        BadCase{"NegativeLookahead", Kind::kRegex, "(?!x)y", "lookahead '(?!' at byte 0 is not supported"},
        BadCase{"Lookbehind", Kind::kRegex, "(?<=a)b", "lookbehind '(?<=' at byte 0 is not supported"},
        BadCase{"NegativeLookbehind", Kind::kRegex, "b(?<!a)", "lookbehind '(?<!' at byte 1 is not supported"},
        BadCase{"InlineFlag", Kind::kRegex, "(?i)abc", "group modifier '(?i' at byte 0 is not supported"},
        BadCase{"PythonNamedGroup", Kind::kRegex, "(?P<n>a)", "group modifier '(?P' at byte 0 is not supported"},
        BadCase{"WordBoundary", Kind::kRegex, R"(\bword)", R"(word boundary '\b' at byte 0 is not supported)"},
        BadCase{"UnicodeProperty", Kind::kRegex, R"([\p{L}]+)",
                R"(Unicode property escape '\p' at byte 1 is not supported)"},
        BadCase{"AnchorEscape", Kind::kRegex, R"(abc\Z)", R"(escape '\Z' at byte 3 is not supported)"},
        BadCase{"CaretInTheMiddle", Kind::kRegex, "^a|b^c", "'^' at byte 4 is not supported"},
        BadCase{"DollarInTheMiddle", Kind::kRegex, "(a$b)$", "'$' at byte 2 is not supported"},
        BadCase{"ParenthesisNesting", Kind::kRegex, std::string(13, '(') + "a" + std::string(13, ')'),
                "parentheses at byte 12 are nested deeper than the limit of 12"},
        BadCase{"NestedRepetitionsWrittenOut", Kind::kRegex, "((a{64}){64}){64}",
                "repetitions written out at byte 13 are more than the limit of 32768 elements"},
        BadCase{"RegexSize", Kind::kRegex, std::string(32769, 'a'), "the regex is 32769 bytes"}),
    CaseName);

INSTANTIATE_TEST_SUITE_P(Grammar, RefusedTest,
                         ::testing::Values(BadCase{"NoRoot", Kind::kGrammar, "start ::= \"a\"\n",
                                                   "the grammar defines no rule named 'root'"},
                                           BadCase{"TooManyRules", Kind::kGrammar, RuleChain(65, "*"),
                                                   "is more than the limit of 64 rules in a grammar"},
                                           BadCase{"TooManyCountedRepetitions", Kind::kGrammar, RuleChain(20, "{0,64}"),
                                                   "is more than the limit of 16 counted repetitions"},
                                           BadCase{"RootOnlyInAComment", Kind::kGrammar,
                                                   "# root ::= \"a\"\nstart ::= \"a\"\n", "no rule named 'root'"},
                                           BadCase{"RootNotAtLineStart", Kind::kGrammar,
                                                   "start ::= \"a\" root ::= \"b\"\n", "no rule named 'root'"},
                                           BadCase{"Repetition", Kind::kGrammar, "root ::= \"a\"{100}",
                                                   "repetition '{100}' at byte 12 is more than the limit of 64"},
                                           BadCase{"RepetitionWithBlanks", Kind::kGrammar, "root ::= (\"a\"){ 0 , 65 }",
                                                   "repetition '{ 0 , 65 }' at byte 14"},
                                           BadCase{"ParenthesisNesting", Kind::kGrammar,
                                                   "root ::= " + std::string(13, '(') + "\"a\"" + std::string(13, ')'),
                                                   "parentheses at byte 21 are nested deeper than the limit of 12"}),
                         CaseName);

// Structural tags: a json_schema format's schema, a regex's pattern and a grammar's text are checked
// as their own kinds are, with their pointers in the tag.
INSTANTIATE_TEST_SUITE_P(
    StructuralTag, RefusedTest,
    ::testing::Values(
        BadCase{"SchemaKeyword", Kind::kStructuralTag,
                R"({"type":"structural_tag","format":{"type":"tag","begin":"<f>","end":"</f>","content":)"
                R"({"type":"json_schema","json_schema":{"type":"object","properties":{"a":{"oneOf":[]}}}}}})",
                "'oneOf' at /format/content/json_schema/properties/a is not supported"},
        BadCase{"SchemaRefInItsOwnDocument", Kind::kStructuralTag,
                R"({"type":"structural_tag","format":{"type":"json_schema","json_schema":{"$ref":"#/$defs/x"}}})",
                "'$ref' '#/$defs/x' at /format/json_schema names no schema"},
        BadCase{
            "Regex", Kind::kStructuralTag,
            R"({"type":"structural_tag","format":{"type":"sequence","elements":[{"type":"const_string","value":"x"},)"
            R"j({"type":"regex","pattern":"(?=a)"}]}})j",
            "the regex at /format/elements/1/pattern: lookahead '(?=' at byte 0 is not supported"},
        BadCase{"Grammar", Kind::kStructuralTag,
                R"({"type":"structural_tag","format":{"type":"grammar","grammar":"start ::= \"a\""}})",
                "the grammar at /format/grammar: the grammar defines no rule named 'root'"},
        BadCase{"LarkGrammar", Kind::kStructuralTag,
                R"({"type":"structural_tag","format":{"type":"grammar","syntax":"lark","grammar":"start: \"a\""}})",
                R"(grammar syntax "lark" at /format/syntax is not supported)"},
        BadCase{
            "Repeat", Kind::kStructuralTag,
            R"({"type":"structural_tag","format":{"type":"repeat","min":0,"max":100,"content":{"type":"any_text"}}})",
            "'max' 100 at /format/max is more than the limit of 64"},
        BadCase{"FormatNesting", Kind::kStructuralTag,
                R"({"type":"structural_tag","format":)" + Repeated(R"({"type":"optional","content":)", 12, "") +
                    R"({"type":"any_text"})" + std::string(13, '}'),
                "is nested deeper than the limit of 12"},
        BadCase{"NotAnObject", Kind::kStructuralTag, "[]", "the structural tag is not a JSON object"},
        BadCase{"NotJson", Kind::kStructuralTag, "{\"type\":", "not valid JSON at byte 8"}),
    CaseName);

TEST(CheckConstraintTest, ChoicesAreBounded) {
  ConstraintSpec spec = Spec(Kind::kChoice, "");
  EXPECT_NE(CheckConstraint(spec, {}).message().find("the choice list is empty"), std::string::npos);
  spec.choices = {"yes", "", "no"};
  EXPECT_NE(CheckConstraint(spec, {}).message().find("choice 1 is empty"), std::string::npos);
  spec.choices.assign(257, "x");
  EXPECT_NE(CheckConstraint(spec, {}).message().find("has 257 choices, more than the limit of 256"), std::string::npos);
  spec.choices.assign(2, std::string(20000, 'x'));
  EXPECT_NE(CheckConstraint(spec, {}).message().find("40000 bytes in all, more than the limit of 32768"),
            std::string::npos);
  spec.choices = {"yes", "no", "maybe"};
  EXPECT_TRUE(CheckConstraint(spec, {}).ok());
}

TEST(CheckConstraintTest, ErrorsNameTheKindWithoutAField) {
  ConstraintSpec spec;
  spec.kind = Kind::kRegex;
  spec.text = "a{99}";
  const absl::Status status = CheckConstraint(spec, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "regex: repetition '{99}' at byte 1 is more than the limit of 64");
}

TEST(CheckConstraintTest, LimitsComeFromTheCaller) {
  ConstraintLimits limits;
  limits.max_enum = 2;
  limits.max_repeat = 3;
  limits.max_depth = 2;
  limits.max_properties = 1;
  EXPECT_FALSE(CheckConstraint(Spec(Kind::kJsonSchema, R"({"enum":[1,2,3]})"), limits).ok());
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kJsonSchema, R"({"enum":[1,2]})"), limits).ok());
  EXPECT_FALSE(CheckConstraint(Spec(Kind::kRegex, "a{4}"), limits).ok());
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kRegex, "a{3}"), limits).ok());
  EXPECT_FALSE(CheckConstraint(Spec(Kind::kJsonSchema, NestedItems(3)), limits).ok());
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kJsonSchema, NestedItems(2)), limits).ok());
  EXPECT_FALSE(CheckConstraint(Spec(Kind::kJsonSchema, ManyProperties(2)), limits).ok());
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kJsonSchema, ManyProperties(1)), limits).ok());
  limits.max_text_bytes = 10;
  EXPECT_FALSE(CheckConstraint(Spec(Kind::kJsonObject, std::string(11, ' ')), limits).ok());
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kJsonObject, ""), limits).ok());
}

TEST(CheckConstraintTest, NestingUpToTheLimitPasses) {
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kJsonSchema, NestedItems(12)), {}).ok());
  EXPECT_TRUE(CheckConstraint(Spec(Kind::kRegex, std::string(12, '(') + "a" + std::string(12, ')')), {}).ok());
  EXPECT_TRUE(
      CheckConstraint(Spec(Kind::kGrammar, "root ::= " + std::string(12, '(') + "\"a\"" + std::string(12, ')')), {})
          .ok());
}

struct GoodCase {
  std::string name;
  Kind kind;
  std::string text;
};
void PrintTo(const GoodCase& c, std::ostream* os) { *os << c.name; }

class AcceptedTest : public ::testing::TestWithParam<GoodCase> {};

TEST_P(AcceptedTest, Passes) {
  const GoodCase& c = GetParam();
  const absl::Status status = CheckConstraint(Spec(c.kind, c.text), ConstraintLimits{});
  EXPECT_TRUE(status.ok()) << status.message() << "\n" << c.text;
  if (c.kind == Kind::kNone) return;
  const absl::Status compiled = CompileWithoutWarning(Spec(c.kind, c.text));
  EXPECT_TRUE(compiled.ok()) << compiled.message() << "\n" << c.text;
}

INSTANTIATE_TEST_SUITE_P(
    Schemas, AcceptedTest,
    ::testing::Values(
        GoodCase{"True", Kind::kJsonSchema, "true"}, GoodCase{"Empty", Kind::kJsonSchema, "{}"},
        GoodCase{
            "NestedObjects", Kind::kJsonSchema,
            R"({"title":"t","$schema":"https://json-schema.org/draft/2020-12/schema","$id":"urn:x","type":"object",)"
            R"("properties":{"customer":{"type":"object","description":"who","properties":{"name":{"type":"string",)"
            R"("minLength":1,"maxLength":40},"vip":{"type":"boolean","default":false}},"required":["name"]}},)"
            R"("required":["customer"],"additionalProperties":false})"},
        GoodCase{
            "Arrays", Kind::kJsonSchema,
            R"({"type":"array","minItems":1,"maxItems":8,"items":{"type":"integer","minimum":-5,"exclusiveMaximum":5}})"},
        GoodCase{"Tuple", Kind::kJsonSchema,
                 R"({"type":"array","prefixItems":[{"type":"string"},{"type":"number"}],"items":false,"maxItems":2})"},
        GoodCase{
            "Enums", Kind::kJsonSchema,
            R"({"type":"object","properties":{"a":{"type":"string","enum":["x","y"]},"b":{"enum":[1,"two",null,{"k":[1]}]},)"
            R"("c":{"type":["integer","null"],"enum":[1,null]},"d":{"const":{"nested":true}}}})"},
        GoodCase{
            "Patterns", Kind::kJsonSchema,
            R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{4}$"},)"
            R"j("day":{"type":"string","format":"date"},"any":{"type":"string","pattern":"(?<y>[0-9]{4})-(?:0[1-9]|1[0-2])"}},)j"
            R"("patternProperties":{"^x-[a-z]+$":{"type":"string"}},"propertyNames":{"pattern":"^[a-z-]+$"}})"},
        GoodCase{
            "DefsAndRefs", Kind::kJsonSchema,
            R"({"$defs":{"item":{"type":"object","properties":{"sku":{"type":"string"}}},"a/b":{"type":"integer"}},)"
            R"("definitions":{"old":{"type":"string"}},"type":"object","properties":{"first":{"$ref":"#/$defs/item"},)"
            R"("slash":{"$ref":"#/$defs/a~1b"},"legacy":{"$ref":"#/definitions/old","description":"d"},)"
            R"("same":{"$ref":"#/properties/first"}}})"},
        GoodCase{
            "RecursiveRef", Kind::kJsonSchema,
            R"({"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","maxItems":3,"items":{"$ref":"#"}}}})"},
        GoodCase{"NullableAnyOf", Kind::kJsonSchema,
                 R"({"anyOf":[{"type":"string","maxLength":10},{"type":"null"}],"title":"t","default":null})"},
        GoodCase{"AllOfOneBranch", Kind::kJsonSchema,
                 R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}}}]})"},
        GoodCase{"IntegerMultipleOf", Kind::kJsonSchema, R"({"type":"integer","multipleOf":15})"},
        GoodCase{
            "ObjectWithoutType", Kind::kJsonSchema,
            R"({"properties":{"a":{"type":"string"}},"additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":3})"},
        GoodCase{"TypeList", Kind::kJsonSchema, R"({"type":["string","integer"],"maxLength":5,"minimum":0})"}),
    [](const ::testing::TestParamInfo<GoodCase>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Others, AcceptedTest,
    ::testing::Values(
        GoodCase{"Regex", Kind::kRegex, R"(^[A-Z]{2}-[0-9]{4}$)"},
        GoodCase{"RegexAnchored", Kind::kRegex, R"(^(a|b(?:c|d))$)"},
        GoodCase{"RegexEscapes", Kind::kRegex, R"([\w.+-]+@[\w-]+\.[a-z]{2,6}\u{1F600}\{64\}[\b\-]\x41\d\s)"},
        GoodCase{"RegexRepetitionsWithinBudget", Kind::kRegex, "(([0-9]{1,3}\\.){3}[0-9]{1,3}){1,64}"},
        GoodCase{
            "Grammar", Kind::kGrammar,
            "# the answer ((( is a tag\nroot ::= \"(\" item{1,5} \")\" # {999}\nitem ::= [a-z(){}]+ | \"{\\\"\" \n"},
        GoodCase{"GrammarRootWithAttributes", Kind::kGrammar,
                 "start ::= \"a\"\n  root[max_tokens=10] ::= start{0, -1}\n"},
        GoodCase{
            "StructuralTag", Kind::kStructuralTag,
            R"({"type":"structural_tag","format":{"type":"triggered_tags","triggers":["<function="],"tags":[)"
            R"({"type":"tag","begin":"<function=lookup>","end":"</function>","content":{"type":"json_schema",)"
            R"("json_schema":{"type":"object","properties":{"order_id":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{4}$"}},)"
            R"("required":["order_id"]}}}]}})"},
        GoodCase{"JsonObject", Kind::kJsonObject, ""}, GoodCase{"None", Kind::kNone, ""}),
    [](const ::testing::TestParamInfo<GoodCase>& info) { return info.param.name; });

// The customer-service schemas in tests/data/schemas, which the structured-output tests fill in.
TEST(CheckConstraintTest, CustomerServiceSchemasPass) {
  const std::filesystem::path dir = testing::TestDataDir() + "/schemas";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    ASSERT_FALSE(text.str().empty()) << entry.path();
    const absl::Status status = CheckConstraint(Spec(Kind::kJsonSchema, text.str()), ConstraintLimits{});
    EXPECT_TRUE(status.ok()) << entry.path() << ": " << status.message();
    const absl::Status compiled = CompileWithoutWarning(Spec(Kind::kJsonSchema, text.str()));
    EXPECT_TRUE(compiled.ok()) << entry.path() << ": " << compiled.message();
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace specula
